"use strict";
// The Node reference: socket.io with @socket.io/redis-adapter, the usual way to fan out
// publications that arrive through Redis. A client emits "subscribe" with a channel name
// and joins that room (answered with "subscribed"); publications come from
// @socket.io/redis-emitter (bench/node/publisher.js) and are emitted to the room.
//
// A room named "private-..." is joined only with the signature a Pusher auth endpoint
// would give: "<app key>:<hex HMAC-SHA256 of '<socket id>:<room>' under the app secret>"
// as the second argument of "subscribe" (refused with "subscribe_error"), so that the
// `nodes` scenario's private subscriptions cost the reference what they cost ours.
//
// With REDIS_URL=redis-cluster://host:port,host:port/ it runs on Redis Cluster with
// socket.io's sharded adapter (createShardedAdapter: SSUBSCRIBE/SPUBLISH, one shard
// channel per room, Redis 7.0 or later).
//
//   REDIS_URL=redis://127.0.0.1:6379/0 node socketio_server.js [port]

const crypto = require("crypto");
const http = require("http");
const { Server } = require("socket.io");
const { createAdapter, createShardedAdapter } = require("@socket.io/redis-adapter");
const { createClient, createCluster } = require("redis");

const APP_KEY = process.env.BENCH_APP_KEY || "bench-key";
const APP_SECRET = process.env.BENCH_APP_SECRET || "bench-secret";

function authorized(socketId, room, auth) {
  const hex = crypto.createHmac("sha256", APP_SECRET).update(`${socketId}:${room}`).digest("hex");
  const expected = Buffer.from(`${APP_KEY}:${hex}`);
  const given = Buffer.from(typeof auth === "string" ? auth : "");
  return given.length === expected.length && crypto.timingSafeEqual(given, expected);
}

function redisClients(url) {
  const cluster = /^redis-cluster:\/\/([^/]+)\/?$/.exec(url || "");
  if (!cluster) {
    const pubClient = createClient({ url });
    return { pubClient, subClient: pubClient.duplicate(), adapter: createAdapter };
  }
  const rootNodes = cluster[1].split(",").map((host) => ({ url: `redis://${host}` }));
  const pubClient = createCluster({ rootNodes });
  return { pubClient, subClient: pubClient.duplicate(), adapter: createShardedAdapter };
}

async function main() {
  const { pubClient, subClient, adapter } = redisClients(process.env.REDIS_URL);
  await Promise.all([pubClient.connect(), subClient.connect()]);

  const httpServer = http.createServer();
  const io = new Server(httpServer, {
    adapter: adapter(pubClient, subClient),
    transports: ["websocket"],
    perMessageDeflate: false,
    serveClient: false,
  });
  io.on("connection", (socket) => {
    socket.on("subscribe", (channel, auth) => {
      if (String(channel).startsWith("private-") && !authorized(socket.id, channel, auth)) {
        socket.emit("subscribe_error", channel);
        return;
      }
      socket.join(channel);
      socket.emit("subscribed", channel);
    });
  });
  const port = Number(process.argv[2] || 0);
  httpServer.listen({ port, host: "127.0.0.1", backlog: 4096 }, () => {
    const bound = httpServer.address().port;
    console.log(`socket.io listening on http://127.0.0.1:${bound}/`);
  });
  const stop = () => {
    io.close();
    Promise.allSettled([pubClient.quit(), subClient.quit()]).then(() => process.exit(0));
  };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
