// Positions: where a publication sits in its channel's history, "<epoch>:<offset>"
// (docs/protocol.md, "Resume"). The epoch may itself contain ":".

export interface Position {
  epoch: string;
  offset: number;
}

/** Parse "<epoch>:<offset>"; null when `text` is not a position. */
export function parsePosition(text: unknown): Position | null {
  if (typeof text !== "string") return null;
  const cut = text.lastIndexOf(":");
  const digits = text.slice(cut + 1);
  if (cut <= 0 || !/^\d+$/.test(digits)) return null;
  return { epoch: text.slice(0, cut), offset: Number(digits) };
}

/** The wire form of `position`. */
export function formatPosition(position: Position): string {
  return `${position.epoch}:${position.offset}`;
}

/** Whether `next` is already covered by `last` (same epoch, not after it). */
export function isReplay(last: string | null, next: string | null): boolean {
  const a = parsePosition(last);
  const b = parsePosition(next);
  return a !== null && b !== null && a.epoch === b.epoch && b.offset <= a.offset;
}
