// pusher-js hands channel events to the page without the fields it does not know, and
// our "position" (where the event sits in the channel's history) is one of them. The
// tap reads each raw frame first: it wraps the browser's WebSocket so that every socket
// to /app/<key> reports its parsed messages, in order, before pusher-js sees them.
// Install it before pusher-js opens a connection.

const listeners = new Set();
let installed = false;

/** Call `listener(message)` with every parsed server message ({event, channel, data, position?}). */
export function onRawMessage(listener) {
  installTap();
  listeners.add(listener);
  return () => listeners.delete(listener);
}

/** Wrap window.WebSocket (idempotent); call before pusher-js connects. */
export function installTap() {
  if (installed) return;
  installed = true;
  const Native = window.WebSocket;
  class TappedWebSocket extends Native {
    constructor(url, protocols) {
      super(url, protocols);
      if (!/\/app\/[^/?]+/.test(String(url))) return;
      // Registered before pusher-js sets onmessage, so it runs first for each frame.
      this.addEventListener("message", (event) => deliver(event.data));
    }
  }
  window.WebSocket = TappedWebSocket;
}

function deliver(text) {
  if (typeof text !== "string" || listeners.size === 0) return;
  let message;
  try {
    message = JSON.parse(text);
  } catch {
    return; // pusher-js reports unparseable frames itself
  }
  if (!message || typeof message !== "object") return;
  if (typeof message.data === "string") {
    try {
      message.data = JSON.parse(message.data);
    } catch {
      // data that is not JSON text stays a string
    }
  }
  for (const listener of listeners) listener(message);
}
