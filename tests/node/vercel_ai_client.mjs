// Reads a run's Vercel AI SDK UI message stream with the `ai` package's own parts:
// parseJsonEventStream + uiMessageChunkSchema (what useChat's transport does with the
// response) validate every chunk, and readUIMessageStream builds the assistant message
// from them. Prints one JSON line: the response headers, the chunks, the message.
//
// Usage: node vercel_ai_client.mjs post <url> <chatId> <user text> [pace_ms]
//        node vercel_ai_client.mjs get <url of <path>/<chatId>/stream>
//        node vercel_ai_client.mjs reconnect <api url (<path>)> <chatId>
//          (DefaultChatTransport.reconnectToStream, what useChat's resumeStream() calls:
//          prints {ok, none: true} when it answers null, "no active stream")
//        node vercel_ai_client.mjs replay <api url> <JSON [[chatId, since], ...]>
//          (reconnectToStream with Last-Event-ID: since, for each run: the run after
//          that position, ended or not; prints {ok, results: [{chunks, errors, message}]})
import {
  DefaultChatTransport,
  parseJsonEventStream,
  readUIMessageStream,
  uiMessageChunkSchema,
} from "ai";

const [mode, url, chatId, text, paceMs = "0"] = process.argv.slice(2);
const report = (fields) => process.stdout.write(JSON.stringify(fields) + "\n");

async function request() {
  if (mode === "get") return fetch(url);
  return fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      id: chatId,
      trigger: "submit-message",
      messageId: undefined,
      messages: [{ id: `${chatId}-user`, role: "user", parts: [{ type: "text", text }] }],
      pace_ms: Number(paceMs),
      trace: true,
    }),
  });
}

async function reconnect() {
  const stream = await new DefaultChatTransport({ api: url }).reconnectToStream({ chatId });
  if (stream === null) return report({ ok: true, none: true });
  const read = await readStream(stream);
  report({ ok: read.errors.length === 0, none: false, ...read });
}

async function replay() {
  const transport = new DefaultChatTransport({ api: url });
  const results = await Promise.all(JSON.parse(chatId).map(async ([id, since]) => {
    const headers = { "Last-Event-ID": since };
    const stream = await transport.reconnectToStream({ chatId: id, headers });
    return stream === null ? { chatId: id, none: true } : { chatId: id, ...(await readStream(stream)) };
  }));
  report({ ok: results.every((r) => !r.none), results });  // errors: a failed run's error part
}

async function readStream(stream) {
  const chunks = [];
  const [forChunks, forMessage] = stream.tee();
  for await (const chunk of forChunks) chunks.push(chunk);
  let message = null;
  const errors = [];
  try {
    for await (const built of readUIMessageStream({
      stream: forMessage,
      terminateOnError: true,
      onError: (error) => errors.push(String(error?.message ?? error)),
    })) {
      message = built;
    }
  } catch (error) {
    // An `error` part ends the stream (a failed run): the message keeps what came before.
    errors.push(String(error?.message ?? error));
  }
  return { chunks, errors, message };
}

try {
  if (mode === "reconnect") await reconnect();
  else if (mode === "replay") await replay();
  else await readResponse();
} catch (error) {
  report({ ok: false, error: String(error?.stack ?? error) });
  process.exitCode = 1;
}

async function readResponse() {
  const response = await request();
  const headers = Object.fromEntries(response.headers.entries());
  if (!response.ok) throw new Error(`HTTP ${response.status}: ${await response.text()}`);
  const [forParser, forRaw] = response.body.tee();
  const rawText = new Response(forRaw).text();
  const chunks = [];
  const invalid = [];
  const parsed = parseJsonEventStream({ stream: forParser, schema: uiMessageChunkSchema });
  for await (const result of parsed) {
    if (result.success) chunks.push(result.value);
    else invalid.push({ raw: result.rawValue, error: String(result.error?.message ?? result.error) });
  }
  const stream = new ReadableStream({
    start(controller) {
      for (const chunk of chunks) controller.enqueue(chunk);
      controller.close();
    },
  });
  let message = null;
  const errors = [];
  for await (const built of readUIMessageStream({
    stream,
    terminateOnError: true,
    onError: (error) => errors.push(String(error?.message ?? error)),
  })) {
    message = built;
  }
  const raw = await rawText;
  report({ ok: invalid.length === 0 && errors.length === 0, headers, chunks, invalid, errors, message,
           endsWithDone: raw.trimEnd().endsWith("data: [DONE]") });
}
