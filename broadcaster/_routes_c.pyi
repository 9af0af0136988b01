from typing import Any

class Route:
    table: Any
    name: bytes
    conn: Any
    raw: Any
    transport: Any
    head: bytes
    epoch: bytes
    offset: int
    limit: int
    open_state: object
    def __init__(
        self,
        table: Any,
        name: bytes,
        conn: Any,
        raw: Any,
        head: bytes,
        epoch: bytes,
        offset: int,
        limit: int,
        open_state: object,
    ) -> None: ...

def deliver(routes: dict[bytes, Any], reply: list[Any]) -> bool: ...
