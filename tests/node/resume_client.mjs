// A pusher-js client that resumes a channel by position, as the dashboard does
// (tests/reliability/test_resume_faults.py).
//
// Usage: node resume_client.mjs <ws host> <ws port> <app key> <epoch> <channel>
// Events on the channel carry data {"n": k}, published on a fresh channel, so event k
// sits at offset k + 1 of <epoch>. Every pusher:subscribe that pusher-js sends (the
// first one and the ones after each reconnection) carries the position of the last
// event received. Prints JSON lines:
//   {"type": "state", "current"}        (pusher-js connection states)
//   {"type": "subscribed"}              (pusher:subscription_succeeded)
//   {"type": "event", "n"}
//   {"type": "resume", "data"}          (broadcaster:resume)
//   {"type": "subscription_error", "data"} / {"type": "error", "error"}
// It runs until stdin closes.
import Pusher from "pusher-js";

const [host, port, key, epoch, name] = process.argv.slice(2);
let offset = 0;

function print(record) {
  process.stdout.write(`${JSON.stringify(record)}\n`);
}

const pusher = new Pusher(key, {
  cluster: "local",
  wsHost: host,
  wsPort: Number(port),
  forceTLS: false,
  enabledTransports: ["ws"],
  disableStats: true,
});

const send = pusher.send_event.bind(pusher);
pusher.send_event = (event, data, channel) => {
  if (event === "pusher:subscribe" && data && data.channel === name) {
    data = { ...data, position: `${epoch}:${offset}` };
  }
  return send(event, data, channel);
};

pusher.connection.bind("state_change", ({ current }) => print({ type: "state", current }));
pusher.connection.bind("error", (error) => print({ type: "error", error }));

const channel = pusher.subscribe(name);
channel.bind_global((event, data) => {
  if (event === "pusher:subscription_succeeded") {
    print({ type: "subscribed" });
  } else if (event === "pusher:subscription_error") {
    print({ type: "subscription_error", data });
  } else if (event === "broadcaster:resume") {
    print({ type: "resume", data });
  } else if (event === "seq") {
    offset = data.n + 1;
    print({ type: "event", n: data.n });
  }
});

process.stdin.resume();
process.stdin.on("end", () => {
  pusher.disconnect();
  process.exit(0);
});
