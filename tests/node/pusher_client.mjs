// A pusher-js client for the end-to-end tests (tests/e2e/server/test_pusher_js.py).
//
// Usage: node pusher_client.mjs <ws host> <ws port> <app key> <app secret> <channel>...
// Connects with pusher-js over plain ws (wss with PUSHER_TLS=1), signs private/presence subscriptions and the
// user sign-in with the app secret (a stand-in for the app's auth endpoint), subscribes
// to every channel given and prints what happens as JSON lines on stdout:
//   {"type": "connected", "socket_id"}
//   {"type": "subscribed", "channel", "members"?}   (members: presence user ids)
//   {"type": "signed_in"}, then {"type": "user_channel"} (joined #server-to-user-<id>)
//   {"type": "user_event", "event", "data"}         (events sent to the signed-in user)
//   {"type": "event", "channel", "event", "data"}   (every other channel event)
//   {"type": "error", ...}
// It runs until stdin closes.
import { createHmac } from "node:crypto";
import Pusher from "pusher-js";

const [host, port, key, secret, ...channels] = process.argv.slice(2);
// PUSHER_TLS=1: wss:// (through a TLS proxy; trust its CA with NODE_EXTRA_CA_CERTS).
const tls = process.env.PUSHER_TLS === "1";
const userId = "node-user";

function sign(text) {
  return `${key}:${createHmac("sha256", secret).update(text).digest("hex")}`;
}

function print(record) {
  process.stdout.write(`${JSON.stringify(record)}\n`);
}

const pusher = new Pusher(key, {
  cluster: "local",
  wsHost: host,
  wsPort: Number(port),
  wssPort: Number(port),
  forceTLS: tls,
  enabledTransports: ["ws"], // in Node, also wss:// with forceTLS
  disableStats: true,
  channelAuthorization: {
    customHandler: ({ socketId, channelName }, callback) => {
      if (channelName.startsWith("presence-")) {
        const channelData = JSON.stringify({ user_id: userId, user_info: { via: "pusher-js" } });
        callback(null, {
          auth: sign(`${socketId}:${channelName}:${channelData}`),
          channel_data: channelData,
        });
      } else {
        callback(null, { auth: sign(`${socketId}:${channelName}`) });
      }
    },
  },
  userAuthentication: {
    customHandler: ({ socketId }, callback) => {
      const userData = JSON.stringify({ id: userId });
      callback(null, { auth: sign(`${socketId}::user::${userData}`), user_data: userData });
    },
  },
});

pusher.connection.bind("connected", () => {
  print({ type: "connected", socket_id: pusher.connection.socket_id });
});
pusher.connection.bind("error", (error) => print({ type: "error", error }));
pusher.connection.bind("message", (message) => {
  if (message.event === "pusher:signin_success") print({ type: "signed_in" });
  if (message.event === "pusher_internal:subscription_succeeded" && message.channel.startsWith("#")) {
    print({ type: "user_channel" });
  }
});
pusher.user.bind_global((event, data) => print({ type: "user_event", event, data }));
pusher.signin();

for (const name of channels) {
  const channel = pusher.subscribe(name);
  channel.bind_global((event, data) => {
    if (event === "pusher:subscription_succeeded") {
      const record = { type: "subscribed", channel: name };
      if (name.startsWith("presence-")) {
        record.members = Object.keys(data.members ?? {}).sort();
      }
      print(record);
    } else if (event === "pusher:subscription_error") {
      print({ type: "error", channel: name, data });
    } else {
      print({ type: "event", channel: name, event, data });
    }
  });
}

process.stdin.resume();
process.stdin.on("end", () => {
  pusher.disconnect();
  process.exit(0);
});
