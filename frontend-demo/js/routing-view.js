// Rendering of a routed step's "which capability and why" block (see routing.js).

import { routingOf } from "./routing.js";

function setText(element, text) {
  const value = text ?? "";
  if (element.textContent !== value) element.textContent = value;
}

function row(root, name, text) {
  const value = root.querySelector(`.route-${name}`);
  value.closest("div").hidden = !text;
  setText(value, text || "");
  return value;
}

/** Fill the `.routing` list of a step card from `step` (hidden for agent steps). */
export function renderRouting(card, step) {
  const root = card.querySelector(".routing");
  const routing = routingOf(step);
  root.hidden = !routing;
  if (!routing) return;
  row(root, "capability", routing.capability);
  const intent = routing.intent;
  row(root, "intent", intent?.capability);
  row(root, "confidence", intent?.confidence == null ? "" : intent.confidence.toFixed(2));
  row(root, "reason", intent?.reason);
  const resolution = routing.resolution;
  const rewritten = resolution && resolution.output !== resolution.input ? resolution.output : "";
  row(root, "resolved", rewritten ? `“${resolution.input}” → “${rewritten}”` : resolution ? "unchanged" : "");
  const decider = row(root, "decider", routing.decider?.text);
  decider.dataset.verdict = routing.decider?.verdict ?? "none";
  row(root, "memory", routing.memory);
}
