/* The compiled direct routes: Route and deliver() of broadcaster/_routes.py, in C.
 *
 * broadcaster/_routes.py is the reference: its module doc gives every condition under
 * which deliver() writes a message and what it refuses, and its Python definitions
 * behave exactly as these on any input (tests/broadcaster/test_routes.py runs both
 * against the same cases; tests/broadcaster/test_routes_differential.py compares them on
 * generated inputs, hostile objects included, and again in a build with
 * AddressSanitizer). A message that fails any condition is declined (False) and takes
 * the hub's full path.
 *
 * Safe for any Python caller: a Route is initialised once, by its constructor, which
 * checks every field; its fields are read-only but the offset; deliver() refuses an
 * uninitialised Route with TypeError, and holds a strong reference to every object it
 * uses across each call that can run Python code (attribute reads, is_closing(),
 * get_write_buffer_size(), write()).
 *
 * Built by hatch_build.py when a C compiler is there; without one the Python definitions
 * serve.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>

static PyObject *str_state, *str_pending, *str_oversized, *str_close_sent, *str_disconnected,
    *str_transport, *str_is_closing, *str_get_write_buffer_size, *str_write;

#define MAX_DIGITS 18 /* an offset of more is declined: past what a position reaches */

typedef struct {
    PyObject_HEAD
    /* head is set last by __init__ and cleared first by tp_clear: NULL means not
     * initialised (every other field may then be NULL too). */
    PyObject *head;       /* bytes */
    PyObject *table;
    PyObject *name;       /* bytes */
    PyObject *conn;
    PyObject *raw;
    PyObject *transport;
    PyObject *epoch;      /* bytes */
    PyObject *open_state;
    long long offset;     /* 0 .. LLONG_MAX */
    Py_ssize_t limit;     /* 0 .. PY_SSIZE_T_MAX */
} Route;

static int
Route_traverse(Route *self, visitproc visit, void *arg)
{
    Py_VISIT(self->head);
    Py_VISIT(self->table);
    Py_VISIT(self->name);
    Py_VISIT(self->conn);
    Py_VISIT(self->raw);
    Py_VISIT(self->transport);
    Py_VISIT(self->epoch);
    Py_VISIT(self->open_state);
    return 0;
}

static int
Route_clear(Route *self)
{
    Py_CLEAR(self->head); /* first: code a release runs sees an uninitialised route */
    Py_CLEAR(self->table);
    Py_CLEAR(self->name);
    Py_CLEAR(self->conn);
    Py_CLEAR(self->raw);
    Py_CLEAR(self->transport);
    Py_CLEAR(self->epoch);
    Py_CLEAR(self->open_state);
    return 0;
}

static void
Route_dealloc(Route *self)
{
    PyObject_GC_UnTrack(self);
    Route_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
not_bytes(const char *field, PyObject *value)
{
    if (PyBytes_CheckExact(value))
        return 0;
    PyErr_Format(PyExc_TypeError, "Route %s must be bytes, not %.100s", field,
                 Py_TYPE(value)->tp_name);
    return -1;
}

/* value as a long long from 0 to most; -1 with TypeError or ValueError otherwise. */
static int
bounded_int(const char *field, PyObject *value, long long most, const char *most_text,
            long long *out)
{
    int overflow = 0;
    long long number;
    if (!PyLong_CheckExact(value)) {
        PyErr_Format(PyExc_TypeError, "Route %s must be an int, not %.100s", field,
                     Py_TYPE(value)->tp_name);
        return -1;
    }
    number = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (number == -1 && PyErr_Occurred())
        return -1;
    if (overflow != 0 || number < 0 || number > most) {
        PyErr_Format(PyExc_ValueError, "Route %s must be from 0 to %s", field, most_text);
        return -1;
    }
    *out = number;
    return 0;
}

static int
Route_init(Route *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"table", "name", "conn", "raw", "head", "epoch", "offset",
                             "limit", "open_state", NULL};
    PyObject *table, *name, *conn, *raw, *head, *epoch, *offset_obj, *limit_obj, *open_state,
        *transport;
    long long offset, limit;
    if (self->head != NULL) {
        PyErr_SetString(PyExc_TypeError, "a Route is initialised once: make a new one");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOOOOO:Route", kwlist, &table, &name,
                                     &conn, &raw, &head, &epoch, &offset_obj, &limit_obj,
                                     &open_state))
        return -1;
    if (not_bytes("name", name) < 0 || not_bytes("head", head) < 0 ||
        not_bytes("epoch", epoch) < 0 ||
        bounded_int("offset", offset_obj, LLONG_MAX, "2**63 - 1", &offset) < 0 ||
        bounded_int("limit", limit_obj, PY_SSIZE_T_MAX, "sys.maxsize", &limit) < 0)
        return -1;
    /* raw.transport may run code: every argument is held (kwds may be a C caller's dict)
     * until the route holds it. */
    Py_INCREF(table);
    Py_INCREF(name);
    Py_INCREF(conn);
    Py_INCREF(raw);
    Py_INCREF(head);
    Py_INCREF(epoch);
    Py_INCREF(open_state);
    transport = PyObject_GetAttr(raw, str_transport);
    if (transport == NULL) {
        Py_DECREF(table);
        Py_DECREF(name);
        Py_DECREF(conn);
        Py_DECREF(raw);
        Py_DECREF(head);
        Py_DECREF(epoch);
        Py_DECREF(open_state);
        return -1;
    }
    /* (Not initialised before, but the getter may have initialised it meanwhile.) */
    Py_XSETREF(self->table, table);
    Py_XSETREF(self->name, name);
    Py_XSETREF(self->conn, conn);
    Py_XSETREF(self->raw, raw);
    Py_XSETREF(self->transport, transport);
    Py_XSETREF(self->epoch, epoch);
    Py_XSETREF(self->open_state, open_state);
    self->offset = offset;
    self->limit = (Py_ssize_t)limit;
    Py_XSETREF(self->head, head);
    return 0;
}

static PyMemberDef Route_members[] = {
    {"table", T_OBJECT_EX, offsetof(Route, table), READONLY, NULL},
    {"name", T_OBJECT_EX, offsetof(Route, name), READONLY, NULL},
    {"conn", T_OBJECT_EX, offsetof(Route, conn), READONLY, NULL},
    {"raw", T_OBJECT_EX, offsetof(Route, raw), READONLY, NULL},
    {"transport", T_OBJECT_EX, offsetof(Route, transport), READONLY, NULL},
    {"head", T_OBJECT_EX, offsetof(Route, head), READONLY, NULL},
    {"epoch", T_OBJECT_EX, offsetof(Route, epoch), READONLY, NULL},
    {"open_state", T_OBJECT_EX, offsetof(Route, open_state), READONLY, NULL},
    {NULL},
};

static int
uninitialised(Route *self, PyObject *error)
{
    if (self->head != NULL)
        return 0;
    PyErr_SetString(error, "an uninitialised Route (made by Route.__new__ without __init__)");
    return 1;
}

static PyObject *
Route_get_offset(Route *self, void *Py_UNUSED(closure))
{
    if (uninitialised(self, PyExc_AttributeError))
        return NULL;
    return PyLong_FromLongLong(self->offset);
}

static int
Route_set_offset(Route *self, PyObject *value, void *Py_UNUSED(closure))
{
    long long offset;
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "a Route's offset cannot be deleted");
        return -1;
    }
    if (bounded_int("offset", value, LLONG_MAX, "2**63 - 1", &offset) < 0 ||
        uninitialised(self, PyExc_TypeError))
        return -1;
    self->offset = offset;
    return 0;
}

static PyObject *
Route_get_limit(Route *self, void *Py_UNUSED(closure))
{
    if (uninitialised(self, PyExc_AttributeError))
        return NULL;
    return PyLong_FromSsize_t(self->limit);
}

static PyGetSetDef Route_getset[] = {
    {"offset", (getter)Route_get_offset, (setter)Route_set_offset,
     PyDoc_STR("The offset of the last position delivered (an int from 0 to 2**63 - 1)."), NULL},
    {"limit", (getter)Route_get_limit, NULL, PyDoc_STR("The connection's buffer limit."), NULL},
    {NULL},
};

static PyObject *
Route_reduce(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    PyErr_SetString(PyExc_TypeError, "a Route cannot be copied or pickled: make a new one");
    return NULL;
}

static PyMethodDef Route_methods[] = {
    {"__reduce__", Route_reduce, METH_NOARGS, NULL},
    {NULL},
};

static PyTypeObject RouteType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "broadcaster._routes_c.Route",
    .tp_doc = PyDoc_STR("One channel's direct route to its only subscriber (see broadcaster._routes)."),
    .tp_basicsize = sizeof(Route),
    /* Not a base type: a subclass could not change what deliver() reads. */
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Route_init,
    .tp_dealloc = (destructor)Route_dealloc,
    .tp_traverse = (traverseproc)Route_traverse,
    .tp_clear = (inquiry)Route_clear,
    .tp_members = Route_members,
    .tp_getset = Route_getset,
    .tp_methods = Route_methods,
};

/* 1 if obj.<name> is true, 0 if false, -1 on error. */
static int
attr_true(PyObject *obj, PyObject *name)
{
    PyObject *value = PyObject_GetAttr(obj, name);
    int truth;
    if (value == NULL)
        return -1;
    truth = PyObject_IsTrue(value);
    Py_DECREF(value);
    return truth;
}

/* 1: obj.<name> is expected (by identity), 0: it is not, -1: error. */
static int
attr_is(PyObject *obj, PyObject *name, PyObject *expected)
{
    PyObject *value = PyObject_GetAttr(obj, name);
    int same;
    if (value == NULL)
        return -1;
    same = value == expected;
    Py_DECREF(value);
    return same;
}

/* 1: obj.<name>() is false, 0: it is true, -1: error. */
static int
call_false(PyObject *obj, PyObject *name)
{
    PyObject *value = PyObject_CallMethodNoArgs(obj, name);
    int truth;
    if (value == NULL)
        return -1;
    truth = PyObject_IsTrue(value);
    Py_DECREF(value);
    return truth < 0 ? truth : !truth;
}

/* Whether the connection takes a direct write now (1, 0, -1 on error): it is open, has
 * nothing queued in this tick and no oversized message that may be unsent, and its
 * socket is not closing. Each read may run Python code; the caller holds every object. */
static int
writable(Route *route, PyObject *conn, PyObject *raw, PyObject *transport)
{
    int ok = attr_is(conn, str_state, route->open_state);
    if (ok > 0)
        ok = attr_is(conn, str_pending, Py_None);
    if (ok > 0) {
        ok = attr_true(conn, str_oversized);
        ok = ok < 0 ? ok : !ok;
    }
    if (ok > 0) {
        ok = attr_true(raw, str_close_sent);
        ok = ok < 0 ? ok : !ok;
    }
    if (ok > 0) {
        ok = attr_true(raw, str_disconnected);
        ok = ok < 0 ? ok : !ok;
    }
    if (ok > 0)
        ok = call_false(transport, str_is_closing);
    return ok;
}

/* What transport.get_write_buffer_size() holds, in *held (1), or 0 when it is past
 * PY_SSIZE_T_MAX (over any limit), -1 on error: it must be a non-negative int. */
static int
buffered_size(PyObject *transport, Py_ssize_t *held)
{
    PyObject *value = PyObject_CallMethodNoArgs(transport, str_get_write_buffer_size);
    int overflow = 0;
    long long size;
    if (value == NULL)
        return -1;
    if (!PyLong_CheckExact(value)) {
        PyErr_Format(PyExc_TypeError, "get_write_buffer_size() returned %.100s, not an int",
                     Py_TYPE(value)->tp_name);
        Py_DECREF(value);
        return -1;
    }
    size = PyLong_AsLongLongAndOverflow(value, &overflow);
    Py_DECREF(value);
    if (overflow < 0 || (overflow == 0 && size < 0)) {
        PyErr_SetString(PyExc_ValueError, "get_write_buffer_size() returned a negative size");
        return -1;
    }
    if (overflow > 0 || size > PY_SSIZE_T_MAX)
        return 0;
    *held = (Py_ssize_t)size;
    return 1;
}

/* The offset of the header <head><offset> <epoch> <exclude>\n when it is the route's
 * next one in its epoch and excludes no socket, else -1. *frame: where the frame starts
 * (after the \n). No Python code runs here. */
static long long
next_offset(Route *route, const char *buf, Py_ssize_t size, const char **frame)
{
    Py_ssize_t head_size = PyBytes_GET_SIZE(route->head);
    const char *p, *end, *digits, *epoch;
    long long offset = 0;
    if (size < head_size || memcmp(buf, PyBytes_AS_STRING(route->head), head_size) != 0)
        return -1;
    p = buf + head_size;
    end = memchr(p, '\n', size - head_size);
    if (end == NULL)
        return -1;
    digits = p;
    while (p < end && *p >= '0' && *p <= '9') {
        if (p - digits >= MAX_DIGITS)
            return -1;
        offset = offset * 10 + (*p - '0');
        p++;
    }
    if (p == digits || p >= end || *p != ' ')
        return -1;
    epoch = ++p;
    while (p < end && *p != ' ')
        p++;
    if (p >= end || p - epoch != PyBytes_GET_SIZE(route->epoch) ||
        memcmp(epoch, PyBytes_AS_STRING(route->epoch), p - epoch) != 0)
        return -1;
    p++; /* the excluded socket id: none ("-") */
    if (end - p != 1 || *p != '-')
        return -1;
    /* (offset - 1: no overflow whatever the route's offset, which may be LLONG_MAX) */
    if (offset - 1 != route->offset)
        return -1;
    *frame = end + 1;
    return offset;
}

/* deliver(routes, reply) -> bool. Every object used is held (a strong reference) from
 * where it is taken to the end: attribute reads and the transport's methods may run
 * Python code that drops the route from its table, clears the reply, and so on. */
static PyObject *
deliver(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *routes, *reply, *name, *data, *found, *frame, *written;
    PyObject *conn = NULL, *raw = NULL, *transport = NULL, *result = NULL;
    Route *route = NULL;
    const char *start, *payload_start;
    Py_ssize_t size, payload, header, buffered = 0;
    long long offset;
    unsigned char *out;
    int ok;

    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "deliver(routes, reply) takes 2 arguments");
        return NULL;
    }
    routes = args[0];
    reply = args[1];
    if (!PyDict_CheckExact(routes)) {
        PyErr_Format(PyExc_TypeError, "deliver: routes must be a dict, not %.100s",
                     Py_TYPE(routes)->tp_name);
        return NULL;
    }
    if (!PyList_CheckExact(reply)) {
        PyErr_Format(PyExc_TypeError, "deliver: reply must be a list (a pub/sub push), not %.100s",
                     Py_TYPE(reply)->tp_name);
        return NULL;
    }
    if (PyList_GET_SIZE(reply) != 3)
        Py_RETURN_FALSE;
    name = PyList_GET_ITEM(reply, 1);
    data = PyList_GET_ITEM(reply, 2);
    if (!PyBytes_CheckExact(name) || !PyBytes_CheckExact(data))
        Py_RETURN_FALSE;
    /* The lookup may run a stored key's __eq__, which may change the reply. */
    Py_INCREF(name);
    Py_INCREF(data);
    found = PyDict_GetItemWithError(routes, name); /* borrowed: held just below */
    Py_XINCREF(found);
    Py_DECREF(name);
    if (found == NULL) {
        if (!PyErr_Occurred())
            result = Py_NewRef(Py_False);
        goto done;
    }
    if (found == Py_None) {
        Py_DECREF(found);
        result = Py_NewRef(Py_False);
        goto done;
    }
    if (!Py_IS_TYPE(found, &RouteType)) {
        PyErr_Format(PyExc_TypeError, "deliver: a route must be a Route, not %.100s",
                     Py_TYPE(found)->tp_name);
        Py_DECREF(found);
        goto done;
    }
    route = (Route *)found;
    if (uninitialised(route, PyExc_TypeError))
        goto done;

    start = PyBytes_AS_STRING(data);
    size = PyBytes_GET_SIZE(data);
    offset = next_offset(route, start, size, &payload_start);
    if (offset < 0) {
        result = Py_NewRef(Py_False);
        goto done;
    }
    conn = Py_NewRef(route->conn);
    raw = Py_NewRef(route->raw);
    transport = Py_NewRef(route->transport);
    ok = writable(route, conn, raw, transport);
    if (ok < 0)
        goto done;
    if (!ok) {
        result = Py_NewRef(Py_False);
        goto done;
    }
    payload = size - (payload_start - start);
    header = payload < 126 ? 2 : payload < 65536 ? 4 : 10;
    ok = buffered_size(transport, &buffered);
    if (ok < 0)
        goto done;
    /* buffered + header + payload > limit, without overflow (limit >= 0) */
    if (!ok || buffered > route->limit - header - payload) {
        result = Py_NewRef(Py_False);
        goto done;
    }

    frame = PyBytes_FromStringAndSize(NULL, header + payload);
    if (frame == NULL)
        goto done;
    out = (unsigned char *)PyBytes_AS_STRING(frame);
    out[0] = 0x81; /* FIN, text */
    if (header == 2) {
        out[1] = (unsigned char)payload;
    } else if (header == 4) {
        out[1] = 126;
        out[2] = (unsigned char)(payload >> 8);
        out[3] = (unsigned char)payload;
    } else {
        unsigned long long n = (unsigned long long)payload;
        out[1] = 127;
        for (int i = 0; i < 8; i++)
            out[2 + i] = (unsigned char)(n >> (56 - 8 * i));
    }
    memcpy(out + header, payload_start, payload);
    written = PyObject_CallMethodOneArg(transport, str_write, frame);
    Py_DECREF(frame);
    if (written == NULL)
        goto done;
    Py_DECREF(written);
    route->offset = offset; /* the position it delivered */
    result = Py_NewRef(Py_True);

done:
    Py_XDECREF(transport);
    Py_XDECREF(raw);
    Py_XDECREF(conn);
    Py_XDECREF(route);
    Py_DECREF(data);
    return result;
}

static PyMethodDef module_methods[] = {
    {"deliver", (PyCFunction)(void (*)(void))deliver, METH_FASTCALL,
     PyDoc_STR("deliver(routes, reply) -> bool: see broadcaster._routes.")},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "broadcaster._routes_c",
    .m_doc = PyDoc_STR("The compiled direct routes of broadcaster._routes."),
    .m_size = -1,
    .m_methods = module_methods,
};

#define INTERN(var, text)                                                              \
    do {                                                                               \
        var = PyUnicode_InternFromString(text);                                        \
        if (var == NULL)                                                               \
            return NULL;                                                               \
    } while (0)

PyMODINIT_FUNC
PyInit__routes_c(void)
{
    PyObject *module;
    INTERN(str_state, "state");
    INTERN(str_pending, "_pending");
    INTERN(str_oversized, "_oversized");
    INTERN(str_close_sent, "close_sent");
    INTERN(str_disconnected, "disconnected");
    INTERN(str_transport, "transport");
    INTERN(str_is_closing, "is_closing");
    INTERN(str_get_write_buffer_size, "get_write_buffer_size");
    INTERN(str_write, "write");
    if (PyType_Ready(&RouteType) < 0)
        return NULL;
    module = PyModule_Create(&module_def);
    if (module == NULL)
        return NULL;
    Py_INCREF(&RouteType);
    if (PyModule_AddObject(module, "Route", (PyObject *)&RouteType) < 0) {
        Py_DECREF(&RouteType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
