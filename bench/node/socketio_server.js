"use strict";
// The Node reference: socket.io with @socket.io/redis-adapter, the usual way to fan out
// publications that arrive through Redis. A client emits "subscribe" with a channel name
// and joins that room (answered with "subscribed"); publications come from
// @socket.io/redis-emitter (bench/node/publisher.js) and are emitted to the room.
//
//   REDIS_URL=redis://127.0.0.1:6379/0 node socketio_server.js [port]

const http = require("http");
const { Server } = require("socket.io");
const { createAdapter } = require("@socket.io/redis-adapter");
const { createClient } = require("redis");

async function main() {
  const pubClient = createClient({ url: process.env.REDIS_URL });
  const subClient = pubClient.duplicate();
  await Promise.all([pubClient.connect(), subClient.connect()]);

  const httpServer = http.createServer();
  const io = new Server(httpServer, {
    adapter: createAdapter(pubClient, subClient),
    transports: ["websocket"],
    perMessageDeflate: false,
    serveClient: false,
  });
  io.on("connection", (socket) => {
    socket.on("subscribe", (channel) => {
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
