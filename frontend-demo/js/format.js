// Small DOM and formatting helpers of the sessions and run pages. Text is only ever set
// as textContent (model and tool text must never be parsed as HTML).

export function setText(node, text) {
  const value = text ?? "";
  if (node.textContent !== value) node.textContent = value;
}

/** A new element of `tag` with `className` and, if given, `text` as its textContent. */
export function element(tag, className = "", text = null) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== null && text !== undefined) node.textContent = String(text);
  return node;
}

export function formatDuration(ms) {
  if (ms === null || ms === undefined || Number.isNaN(ms)) return "—";
  if (ms < 1) return ms <= 0 ? "0 ms" : "<1 ms";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(ms < 10_000 ? 2 : 1)} s`;
  const minutes = Math.floor(ms / 60_000);
  return `${minutes} min ${Math.round((ms % 60_000) / 1000)} s`;
}

const numbers = new Intl.NumberFormat("en");
export const formatNumber = (value) => numbers.format(value ?? 0);

/** A unix time in seconds as local date and time. */
export function formatTime(seconds) {
  if (typeof seconds !== "number") return "—";
  return new Date(seconds * 1000).toLocaleString("en-GB", { dateStyle: "short", timeStyle: "medium" });
}
