"""The compiled direct routes (``broadcaster/_routes_c.c``) and their Python definition
(:mod:`broadcaster._routes`) on any input, compared on generated scenarios.

Hypothesis draws a scenario: the arguments of a ``Route`` (every type, in range or not),
what the route table holds (the route, an uninitialised one, something else, a key
whose ``__eq__`` runs code), the reply (a list or not, of any length and element
types; a header near or far from the next one) and how every object ``deliver`` touches
answers: a value of any type, a missing attribute, an exception, or a callback that
clears the reply, empties the table, drops the references, re-initialises the route,
moves its offset or calls ``deliver`` again. The scenario is built afresh for each
definition and each must give the same transcript: every attribute read and call on
those objects in order, the result or the exception's type, the bytes written, and the
route after (its offset, and what setting, copying or re-initialising it does).

``test_the_differential_test_is_clean_under_address_sanitizer`` runs this module again
in a subprocess against a build of the C file with AddressSanitizer and every object
allocated by malloc (``PYTHONMALLOC=malloc``), so a reference held borrowed across a
callback, or a read of an uninitialised route, is reported there.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

import hatch_build
from broadcaster import _routes as routes
from tests.support.processes import IN_CI, REPO

BUILD = "ROUTES_C_UNDER_TEST"
"""The path of a build of ``_routes_c.c`` to test instead of the installed one (set by
the sanitizer run for its subprocess)."""
EXAMPLES = 500 if os.environ.get(BUILD) else 1500
"""Generated scenarios: fewer in the sanitized run, where each costs about three times
as much."""
NAME = b"pub:1:agent.run"
HEAD = b"2 1 agent.run "
EPOCH = b"e1"
OFFSET = 4  # the route's; the next publication is 5


def compiled_module() -> ModuleType:
    path = os.environ.get(BUILD)
    if path:
        spec = importlib.util.spec_from_file_location("broadcaster._routes_c", path)
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    if not routes.COMPILED:
        if IN_CI:
            pytest.fail("broadcaster/_routes_c.c is not compiled: run scripts/install")
        pytest.skip("broadcaster/_routes_c.c is not compiled here (no C compiler)")
    from broadcaster import _routes_c

    return _routes_c


@pytest.fixture(scope="module")
def definitions() -> dict[str, tuple[Any, Any]]:
    """kind -> (Route, deliver)."""
    module = compiled_module()
    return {
        "python": (routes.PyRoute, routes.py_deliver),
        "compiled": (module.Route, module.deliver),
    }


# -- how the objects answer -----------------------------------------------------------

# A behaviour: ("value", key) | ("missing",) | ("raise",) | ("effect", effect, key).
Behaviour = tuple[str, ...]

TRUTHS = ["false", "true", "zero", "one", "none", "open", "other", "badbool", "loud", "list"]
SIZES = ["0", "fits", "over", "huge", "negative", "hugeneg", "bool", "float", "intsub", "str"]
EFFECTS = [
    "clear_reply",
    "clear_routes",
    "drop_all",
    "reinit",
    "set_offset",
    "set_offset_bad",
    "deliver_again",
]


def behaviours(values: list[str]) -> list[Behaviour]:
    """Every behaviour of an attribute or a method whose values are ``values``."""
    return [
        *[("value", key) for key in values],
        ("missing",),
        ("raise",),
        *[("effect", effect, key) for effect in EFFECTS for key in values],
    ]


def plain(key: str) -> Behaviour:
    return ("value", key)


class BadBool:
    def __bool__(self) -> bool:
        raise ArithmeticError("no truth")


class IntSub(int):
    pass


class BytesSub(bytes):
    pass


class ListSub(list):  # type: ignore[type-arg]
    pass


class DictSub(dict):  # type: ignore[type-arg]
    def get(self, *args: Any) -> Any:
        raise AssertionError("never called: a dict subclass is refused first")


class Boom(Exception):
    """What an object raises when told to."""


@dataclass(frozen=True)
class Scenario:
    name: str = "bytes"  # the Route's name argument
    head: str = "bytes"
    epoch: str = "bytes"
    offset: str = "4"
    limit: str = "1MiB"
    raw_transport: Behaviour = ("value", "transport")
    table: str = "route"  # what routes[NAME] is
    collider: str | None = None  # an effect run by another key's __eq__ in the lookup
    routes_kind: str = "dict"
    reply_kind: str = "list"
    reply_length: int = 3
    name_kind: str = "bytes"
    data_kind: str = "bytes"
    header: str = "next"
    frame_size: int = 10
    state: Behaviour = ("value", "open")
    pending: Behaviour = ("value", "none")
    oversized: Behaviour = ("value", "zero")
    close_sent: Behaviour = ("value", "false")
    disconnected: Behaviour = ("value", "false")
    is_closing: Behaviour = ("value", "false")
    buffered: Behaviour = ("value", "0")
    write: Behaviour = ("value", "none")
    set_offset: str = "4"
    again: bool = False  # deliver the next publication after the first


HEADERS = {
    "next": b"5 e1 -",
    "copy": b"4 e1 -",
    "gap": b"6 e1 -",
    "zeros": b"0005 e1 -",
    "18 digits": b"0" * 17 + b"5 e1 -",
    "19 digits": b"0" * 18 + b"5 e1 -",
    "signed": b"+5 e1 -",
    "empty offset": b" e1 -",
    "other epoch": b"5 e2 -",
    "longer epoch": b"5 e11 -",
    "empty epoch": b"5  -",
    "excluded": b"5 e1 1.1",
    "extra field": b"5 e1 - x",
    "two spaces": b"5 e1  -",
    "no exclude": b"5 e1",
    "nothing": b"",
}
VALUES_OF_OFFSET = {
    "4": 4,
    "0": 0,
    "max": (1 << 63) - 1,
    "18 digits": 10**18 - 1,
    "-1": -1,
    "2**63": 1 << 63,
    "bool": True,
    "float": 4.0,
    "str": "4",
    "intsub": IntSub(4),
}
VALUES_OF_LIMIT = {
    "100": 100,
    "0": 0,
    "1MiB": 1 << 20,
    "maxsize": sys.maxsize,
    "maxsize+1": sys.maxsize + 1,
    "-1": -1,
    "bool": True,
    "float": 100.0,
}


ALTERNATIVES: dict[str, list[Any]] = {
    "name": ["bytearray", "str", "bytes_sub", "none"],
    "head": ["bytearray", "memoryview", "str"],
    "epoch": ["bytearray", "bytes_sub"],
    "offset": [k for k in VALUES_OF_OFFSET if k != "4"],
    "limit": [k for k in VALUES_OF_LIMIT if k != "1MiB"],
    "raw_transport": behaviours(["transport"])[1:],
    "table": ["uninitialised", "none", "other", "absent"],
    "collider": EFFECTS,
    "routes_kind": ["dict_sub", "list", "none"],
    "reply_kind": ["tuple", "list_sub", "none", "bytes"],
    "reply_length": [0, 1, 2, 4],
    "name_kind": ["other", "bytearray", "memoryview", "bytes_sub", "str", "int"],
    "data_kind": ["bytearray", "memoryview", "bytes_sub", "str", "none"],
    "header": [h for h in [*HEADERS, "no newline", "other head", "short"] if h != "next"],
    "frame_size": [0, 1, 60, 61, 125, 126, 65535, 65536],
    "state": behaviours(TRUTHS),
    "pending": behaviours(TRUTHS),
    "oversized": behaviours(TRUTHS),
    "close_sent": behaviours(TRUTHS),
    "disconnected": behaviours(TRUTHS),
    "is_closing": behaviours([*TRUTHS, "notcallable"]),
    "buffered": behaviours(SIZES),
    "write": behaviours(["none", "one"]),
    "set_offset": list(VALUES_OF_OFFSET),
    "again": [True],
}
"""The other values of each field of a :class:`Scenario`."""


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    """The writing path's scenario with up to 5 fields changed (few draws: generating
    is most of the time a case takes)."""
    changed = draw(st.lists(st.sampled_from(list(ALTERNATIVES)), max_size=5, unique=True))
    return replace(
        Scenario(), **{name: draw(st.sampled_from(ALTERNATIVES[name])) for name in changed}
    )


# -- one run --------------------------------------------------------------------------


@dataclass
class Run:
    """One scenario built for one definition, and its transcript."""

    scenario: Scenario
    route_class: Any
    deliver: Callable[[Any, Any], Any]
    log: list[Any] = field(default_factory=list)
    fired: set[str] = field(default_factory=set)
    route: Any = None
    routes: Any = None
    reply: Any = None
    transport: Any = None
    open: object = field(default_factory=object)

    def outcome(self, what: str, action: Callable[[], Any]) -> None:
        try:
            result = action()
        except Exception as exc:  # the type is the outcome compared
            self.log.append((what, "raised", type(exc).__name__))
        else:
            shown = result if type(result) in (bool, int, bytes) or result is None else "-"
            self.log.append((what, "returned", shown))

    def value(self, key: str) -> Any:
        made: dict[str, Callable[[], Any]] = {
            "false": lambda: False,
            "true": lambda: True,
            "zero": lambda: 0,
            "one": lambda: 1,
            "none": lambda: None,
            "open": lambda: self.open,
            "other": object,
            "badbool": BadBool,
            "loud": lambda: self.loud(),
            "list": lambda: [b"queued"],
            "notcallable": lambda: 5,
            "transport": lambda: self.transport,
            "0": lambda: 0,
            "fits": lambda: self.room(),  # the frame just fits the limit
            "over": lambda: self.room() + 1,
            "huge": lambda: 1 << 70,
            "negative": lambda: -1,
            "hugeneg": lambda: -(1 << 70),
            "bool": lambda: False,
            "float": lambda: 0.0,
            "intsub": lambda: IntSub(0),
            "str": lambda: "0",
        }
        return made[key]()

    def room(self) -> int:
        """What the transport may hold for the frame to fit the limit exactly."""
        size = self.scenario.frame_size
        header = 2 if size < 126 else 4 if size < 65536 else 10
        limit = VALUES_OF_LIMIT[self.scenario.limit]
        return int(limit) - header - size

    def loud(self) -> Any:
        run = self

        class Loud:
            def __bool__(self) -> bool:
                run.log.append("bool")
                return False

        return Loud()

    def answer(self, what: str, behaviour: Behaviour) -> Any:
        self.log.append(what)
        kind = behaviour[0]
        if kind == "raise":
            raise Boom(what)
        if kind == "effect":
            self.effect(behaviour[1])
            return self.value(behaviour[2])
        return self.value(behaviour[1])

    def effect(self, name: str) -> None:
        """Run ``name`` the first time only (a re-entrant deliver would loop)."""
        if name in self.fired:
            return
        self.fired.add(name)
        route = self.route
        actions: dict[str, Callable[[], Any]] = {
            "clear_reply": lambda: self.reply.clear(),
            "clear_routes": lambda: self.routes.clear(),
            "drop_all": self.drop_all,
            "reinit": lambda: route.__init__(*self.arguments()),
            "set_offset": lambda: setattr(route, "offset", 100),
            "set_offset_bad": lambda: setattr(route, "offset", "x"),
            "deliver_again": lambda: self.deliver(self.routes, self.reply),
        }
        self.outcome(f"effect {name}", actions[name])

    def drop_all(self) -> None:
        """Drop every reference the scenario holds: only deliver's own keep things."""
        if isinstance(self.routes, dict):
            self.routes.clear()
        if isinstance(self.reply, list):
            self.reply.clear()
        self.route = self.transport = None

    def probe(self, label: str, answers: dict[str, Behaviour], methods: set[str]) -> Any:
        """An object whose attributes answer as told (an attribute told "missing" is
        absent); a method's behaviour is its call's."""
        run = self
        namespace: dict[str, Any] = {}
        for attr, behaviour in answers.items():
            if behaviour == ("missing",):
                continue
            what = f"{label}.{attr}"
            if attr in methods:

                def method(self: Any, *args: Any, w: str = what, b: Behaviour = behaviour) -> Any:
                    run.log.append((f"{w}()", *[bytes(a) for a in args]))
                    return run.answer(w, b)

                if behaviour == ("value", "notcallable"):
                    namespace[attr] = 5
                else:
                    namespace[attr] = method
            else:
                namespace[attr] = property(lambda _, w=what, b=behaviour: run.answer(w, b))
        return type(label, (), namespace)()

    def arguments(self) -> list[Any]:
        s = self.scenario
        kinds: dict[str, Callable[[bytes], Any]] = {
            "bytes": lambda b: bytes(bytearray(b)),
            "bytearray": bytearray,
            "memoryview": memoryview,
            "str": lambda b: b.decode(),
            "bytes_sub": BytesSub,
            "none": lambda b: None,
        }
        return [
            self.table,
            kinds[s.name](NAME),
            self.conn,
            self.raw,
            kinds[s.head](HEAD),
            kinds[s.epoch](EPOCH),
            VALUES_OF_OFFSET[s.offset],
            VALUES_OF_LIMIT[s.limit],
            self.open,
        ]

    def payload(self, offset: int) -> bytes:
        s = self.scenario
        frame = b"f" * s.frame_size
        header = HEADERS.get(s.header, HEADERS["next"]).replace(b"5", str(offset).encode(), 1)
        head = b"2 1 agent.other " if s.header == "other head" else HEAD
        newline = b"" if s.header == "no newline" else b"\n"
        if s.header == "short":
            return bytes(bytearray(HEAD[:5]))
        # A new object, held by the reply only: a callback that clears the reply frees it.
        return bytes(bytearray(head + header + newline + frame))

    def build_reply(self, offset: int) -> Any:
        s = self.scenario
        names: dict[str, Callable[[], Any]] = {
            "bytes": lambda: bytes(bytearray(NAME)),
            "other": lambda: b"pub:1:agent.other",
            "bytearray": lambda: bytearray(NAME),
            "memoryview": lambda: memoryview(NAME),
            "bytes_sub": lambda: BytesSub(NAME),
            "str": lambda: NAME.decode(),
            "int": lambda: 7,
        }
        data: dict[str, Callable[[bytes], Any]] = {
            "bytes": lambda b: b,
            "bytearray": bytearray,
            "memoryview": memoryview,
            "bytes_sub": BytesSub,
            "str": lambda b: b.decode(),
            "none": lambda b: None,
        }
        items = [b"message", names[s.name_kind](), data[s.data_kind](self.payload(offset))]
        items = [*items, b"extra"][: s.reply_length]
        kinds: dict[str, Callable[[list[Any]], Any]] = {
            "list": list,
            "tuple": tuple,
            "list_sub": ListSub,
            "none": lambda _: None,
            "bytes": lambda _: b"message",
        }
        return kinds[s.reply_kind](items)

    def build_routes(self) -> Any:
        s = self.scenario
        table: dict[Any, Any] = {}
        if s.collider is not None:
            table[Collider(self, s.collider)] = None  # first: the lookup compares it
        values: dict[str, Callable[[], Any]] = {
            "route": lambda: self.route,
            "uninitialised": lambda: self.route_class.__new__(self.route_class),
            "none": lambda: None,
            "other": lambda: "a route",
        }
        if s.table != "absent":
            table[bytes(bytearray(NAME))] = values[s.table]()
        kinds: dict[str, Callable[[dict[Any, Any]], Any]] = {
            "dict": lambda t: t,
            "dict_sub": DictSub,
            "list": list,
            "none": lambda _: None,
        }
        return kinds[s.routes_kind](table)

    def transcript(self) -> list[Any]:
        s = self.scenario
        self.table = object()
        self.transport = self.probe(
            "transport",
            {"is_closing": s.is_closing, "get_write_buffer_size": s.buffered, "write": s.write},
            {"is_closing", "get_write_buffer_size", "write"},
        )
        self.conn = self.probe(
            "conn", {"state": s.state, "_pending": s.pending, "_oversized": s.oversized}, set()
        )
        self.raw = self.probe(
            "raw",
            {
                "transport": s.raw_transport,
                "close_sent": s.close_sent,
                "disconnected": s.disconnected,
            },
            set(),
        )
        self.outcome("Route()", lambda: setattr(self, "route", self.route_class(*self.arguments())))
        self.routes = self.build_routes()
        self.reply = self.build_reply(OFFSET + 1)
        self.outcome("deliver", lambda: self.deliver(self.routes, self.reply))
        if s.again:
            self.reply = self.build_reply(OFFSET + 2)
            self.outcome("deliver again", lambda: self.deliver(self.routes, self.reply))
        self.after()
        return self.log

    def after(self) -> None:
        """The route after: its fields, and what setting, copying, re-initialising and
        subclassing it do (an uninitialised one too)."""
        s = self.scenario
        for route in (self.route, self.route_class.__new__(self.route_class)):
            if route is None:
                continue
            for attr in ("offset", "limit", "name", "head", "epoch"):
                self.outcome(f"route.{attr}", lambda r=route, a=attr: getattr(r, a))
            for attr in ("table", "conn", "raw", "transport", "open_state"):
                self.outcome(f"route.{attr} =", lambda r=route, a=attr: setattr(r, a, None))
            value = VALUES_OF_OFFSET[s.set_offset]
            self.outcome("route.offset = v", lambda r=route, v=value: setattr(r, "offset", v))
            self.outcome("route.offset", lambda r=route: r.offset)
            self.outcome("del route.offset", lambda r=route: delattr(r, "offset"))
            self.outcome("copy", lambda r=route: copy.copy(r))
            self.outcome("reinit", lambda r=route: r.__init__(*self.arguments()))
        self.outcome("subclass", lambda: type("Sub", (self.route_class,), {}))
        if isinstance(self.reply, list):
            self.log.append(("reply left", len(self.reply)))


class Collider:
    """A table key equal in hash to every route name, whose ``__eq__`` runs an effect
    (and is never equal): the dict lookup of a name calls it."""

    def __init__(self, run: Run, effect: str) -> None:
        self.run = run
        self.name = effect

    def __hash__(self) -> int:
        return hash(NAME)

    def __eq__(self, other: object) -> bool:
        self.run.log.append("collider ==")
        self.run.effect(self.name)
        return False


def transcripts(definitions: dict[str, tuple[Any, Any]], scenario: Scenario) -> Iterator[Any]:
    for route_class, deliver in definitions.values():
        yield Run(scenario, route_class, deliver).transcript()


WRITES = Scenario()


@pytest.mark.slow  # about 10 s: out of the quick tier; the known attacks below stay in it
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(scenarios())
@example(WRITES)
def test_the_compiled_routes_and_their_python_definition_behave_alike(
    definitions: dict[str, tuple[Any, Any]], scenario: Scenario
) -> None:
    python, compiled = transcripts(definitions, scenario)
    assert compiled == python, scenario
    event(" ".join(str(x) for x in next(e for e in python if e[0] == "deliver")[1:]))


ATTACKS = {
    "an uninitialised route in the table": Scenario(table="uninitialised"),
    "a tuple reply": Scenario(reply_kind="tuple"),
    "a list subclass reply": Scenario(reply_kind="list_sub"),
    "a bytearray payload": Scenario(data_kind="bytearray"),
    "a memoryview payload": Scenario(data_kind="memoryview"),
    "a bytes subclass payload": Scenario(data_kind="bytes_sub"),
    "a bytearray name": Scenario(name_kind="bytearray"),
    "a dict subclass table": Scenario(routes_kind="dict_sub"),
    "the reply cleared by is_closing()": Scenario(
        is_closing=("effect", "clear_reply", "false"), frame_size=65536
    ),
    "the reply cleared by get_write_buffer_size()": Scenario(
        buffered=("effect", "clear_reply", "0"), frame_size=65536
    ),
    "everything dropped by get_write_buffer_size()": Scenario(
        buffered=("effect", "drop_all", "0"), frame_size=65536
    ),
    "everything dropped by the state's read": Scenario(state=("effect", "drop_all", "open")),
    "the reply cleared in the table lookup": Scenario(collider="clear_reply", frame_size=65536),
    "the route re-initialised by write()": Scenario(write=("effect", "reinit", "none")),
    "deliver re-entered from write()": Scenario(write=("effect", "deliver_again", "none")),
    "the offset set past the next by write()": Scenario(write=("effect", "set_offset", "none")),
    "a route at the largest offset": Scenario(offset="max"),
    "a write buffer size past a signed size": Scenario(buffered=plain("huge")),
    "a negative write buffer size": Scenario(buffered=plain("negative")),
    "a bool write buffer size": Scenario(buffered=plain("bool")),
    "a float write buffer size": Scenario(buffered=plain("float")),
    "a limit of sys.maxsize": Scenario(limit="maxsize", buffered=plain("huge")),
    "a frame that just fits the limit": Scenario(
        limit="100", frame_size=60, buffered=plain("fits")
    ),
    "a frame one byte over the limit": Scenario(limit="100", frame_size=60, buffered=plain("over")),
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_each_known_attack_gives_the_same_transcript(
    definitions: dict[str, tuple[Any, Any]], attack: str
) -> None:
    python, compiled = transcripts(definitions, ATTACKS[attack])
    assert compiled == python


def test_the_scenario_of_the_writing_path_writes_one_frame(
    definitions: dict[str, tuple[Any, Any]],
) -> None:
    """(So the generated scenarios, which keep its fields half the time, reach it.)"""
    for transcript in transcripts(definitions, WRITES):
        assert ("transport.write()", bytes((0x81, 10)) + b"f" * 10) in transcript
        assert ("deliver", "returned", True) in transcript


# -- the same under AddressSanitizer --------------------------------------------------


def asan_runtime() -> str | None:
    """The path of the compiler's AddressSanitizer runtime, or None."""
    try:
        found = subprocess.run(
            [*hatch_build.compiler(), "-print-file-name=libasan.so"],
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
    except OSError:
        return None
    path = found.stdout.strip()
    return path if found.returncode == 0 and os.path.isabs(path) and os.path.exists(path) else None


@pytest.mark.io
@pytest.mark.timeout(180)
def test_the_differential_test_is_clean_under_address_sanitizer(tmp_path: Path) -> None:
    """Build the C file with -fsanitize=address and run this module's tests against it
    in a python with the sanitizer's runtime preloaded, every object from malloc."""
    runtime = asan_runtime()
    target = tmp_path / ("_routes_c" + str(__import__("sysconfig").get_config_var("EXT_SUFFIX")))
    built = runtime is not None and hatch_build.compile_extension(
        REPO / hatch_build.SOURCE, target, ["-fsanitize=address", "-fno-omit-frame-pointer", "-g"]
    )
    if not built:
        message = "no AddressSanitizer here: a C compiler with libasan (gcc) is needed"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    env = {
        **os.environ,
        BUILD: str(target),
        "LD_PRELOAD": str(runtime),
        # CPython frees not everything at exit, by design; a report aborts the process.
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1:halt_on_error=1",
        "PYTHONMALLOC": "malloc",
    }
    env.pop("COV_CORE_SOURCE", None)  # no coverage in the sanitized run
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            __file__,
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "-k",
            "not address_sanitizer",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=170,
    )
    report = done.stdout[-4000:] + done.stderr[-8000:]
    assert "AddressSanitizer" not in done.stderr, report
    assert done.returncode == 0, report
    assert " passed" in done.stdout, report
