"""The plain-number metrics of the hot path and their Prometheus exposition."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from broadcaster.metrics import LatencyHistogram, Metrics


def test_latency_histogram_counts_a_value_in_the_first_bucket_at_or_above_it() -> None:
    histogram = LatencyHistogram((0.001, 0.01))
    for value in (0.0005, 0.001, 0.002, 0.01, 3.0):
        histogram.observe(value)
    assert histogram.counts == [2, 2, 1]
    assert histogram.buckets() == [("0.001", 2.0), ("0.01", 4.0), ("+Inf", 5.0)]
    assert histogram.count == 5
    assert histogram.total == sum((0.0005, 0.001, 0.002, 0.01, 3.0))


def test_latency_histogram_counts_one_value_several_times() -> None:
    histogram = LatencyHistogram((0.001, 0.01))
    histogram.observe(0.002, 3)
    histogram.observe(0.0005)
    assert histogram.counts == [1, 3, 0]
    assert histogram.count == 4
    assert histogram.total == 0.002 * 3 + 0.0005


def test_exposition_reports_the_plain_counters_and_the_histogram() -> None:
    metrics = Metrics()
    metrics.messages_in += 2
    metrics.messages_out += 7
    metrics.publications += 3
    metrics.http_publishes += 4
    metrics.send_latency.observe(0.002)
    samples = {
        (sample.name, sample.labels.get("le")): sample.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for sample in family.samples
    }
    assert samples[("broadcaster_messages_in_total", None)] == 2
    assert samples[("broadcaster_messages_out_total", None)] == 7
    assert samples[("broadcaster_publications_total", None)] == 3
    assert samples[("broadcaster_http_publishes_total", None)] == 4
    assert samples[("broadcaster_publish_send_seconds_bucket", "0.001")] == 0
    assert samples[("broadcaster_publish_send_seconds_bucket", "0.0025")] == 1
    assert samples[("broadcaster_publish_send_seconds_bucket", "+Inf")] == 1
    assert samples[("broadcaster_publish_send_seconds_count", None)] == 1
    assert samples[("broadcaster_publish_send_seconds_sum", None)] == 0.002
