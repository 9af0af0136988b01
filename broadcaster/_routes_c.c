/* The compiled direct routes: Route and deliver() of broadcaster/_routes.py, in C.
 *
 * broadcaster/_routes.py is the reference: its module doc gives every condition under
 * which deliver() writes a message, and its Python definitions behave exactly as these
 * (tests/broadcaster/test_routes.py runs both against the same cases). A message that
 * fails any condition is declined (False) and takes the hub's full path.
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

typedef struct {
    PyObject_HEAD
    PyObject *table;
    PyObject *name;
    PyObject *conn;
    PyObject *raw;
    PyObject *transport;
    PyObject *head;       /* bytes */
    PyObject *epoch;      /* bytes */
    long long offset;
    Py_ssize_t limit;
    PyObject *open_state;
} Route;

static int
Route_traverse(Route *self, visitproc visit, void *arg)
{
    Py_VISIT(self->table);
    Py_VISIT(self->name);
    Py_VISIT(self->conn);
    Py_VISIT(self->raw);
    Py_VISIT(self->transport);
    Py_VISIT(self->head);
    Py_VISIT(self->epoch);
    Py_VISIT(self->open_state);
    return 0;
}

static int
Route_clear(Route *self)
{
    Py_CLEAR(self->table);
    Py_CLEAR(self->name);
    Py_CLEAR(self->conn);
    Py_CLEAR(self->raw);
    Py_CLEAR(self->transport);
    Py_CLEAR(self->head);
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
Route_init(Route *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"table", "name", "conn", "raw", "head", "epoch", "offset",
                             "limit", "open_state", NULL};
    PyObject *table, *name, *conn, *raw, *head, *epoch, *open_state, *transport;
    long long offset;
    Py_ssize_t limit;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OSOOSSLnO", kwlist, &table, &name, &conn,
                                     &raw, &head, &epoch, &offset, &limit, &open_state))
        return -1;
    transport = PyObject_GetAttr(raw, str_transport);
    if (transport == NULL)
        return -1;
    Py_XSETREF(self->transport, transport);
    Py_INCREF(table);
    Py_XSETREF(self->table, table);
    Py_INCREF(name);
    Py_XSETREF(self->name, name);
    Py_INCREF(conn);
    Py_XSETREF(self->conn, conn);
    Py_INCREF(raw);
    Py_XSETREF(self->raw, raw);
    Py_INCREF(head);
    Py_XSETREF(self->head, head);
    Py_INCREF(epoch);
    Py_XSETREF(self->epoch, epoch);
    Py_INCREF(open_state);
    Py_XSETREF(self->open_state, open_state);
    self->offset = offset;
    self->limit = limit;
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
    {"offset", T_LONGLONG, offsetof(Route, offset), 0, NULL},
    {"limit", T_PYSSIZET, offsetof(Route, limit), READONLY, NULL},
    {"open_state", T_OBJECT_EX, offsetof(Route, open_state), READONLY, NULL},
    {NULL},
};

static PyTypeObject RouteType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "broadcaster._routes_c.Route",
    .tp_doc = PyDoc_STR("One channel's direct route to its only subscriber (see broadcaster._routes)."),
    .tp_basicsize = sizeof(Route),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Route_init,
    .tp_dealloc = (destructor)Route_dealloc,
    .tp_traverse = (traverseproc)Route_traverse,
    .tp_clear = (inquiry)Route_clear,
    .tp_members = Route_members,
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
    if (value == NULL)
        return -1;
    Py_DECREF(value);
    return value == expected;
}

#define DECLINE Py_RETURN_FALSE
#define CHECK(cond)                                                                     \
    do {                                                                               \
        int c_ = (cond);                                                               \
        if (c_ < 0)                                                                    \
            return NULL;                                                               \
        if (!c_)                                                                       \
            DECLINE;                                                                   \
    } while (0)

static PyObject *
deliver(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *routes, *reply, *name, *data, *found, *result;
    Route *route;
    const char *buf, *end, *p, *offset_start, *epoch_start;
    Py_ssize_t size, head_size, payload, header, buffered;
    long long offset = 0;
    unsigned char *out;
    PyObject *frame;

    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "deliver(routes, reply) takes 2 arguments");
        return NULL;
    }
    routes = args[0];
    reply = args[1];
    if (!PyDict_Check(routes)) {
        PyErr_SetString(PyExc_TypeError, "deliver: routes must be a dict");
        return NULL;
    }
    if (!PyList_Check(reply) || PyList_GET_SIZE(reply) != 3)
        DECLINE;
    name = PyList_GET_ITEM(reply, 1);
    data = PyList_GET_ITEM(reply, 2);
    found = PyDict_GetItemWithError(routes, name); /* borrowed */
    if (found == NULL) {
        if (PyErr_Occurred())
            return NULL;
        DECLINE;
    }
    if (!PyObject_TypeCheck(found, &RouteType) || !PyBytes_Check(data))
        DECLINE;
    route = (Route *)found;
    Py_INCREF(route); /* a write may run code that drops it from the table */

    /* The header: <head><offset> <epoch> <exclude>\n */
    buf = PyBytes_AS_STRING(data);
    size = PyBytes_GET_SIZE(data);
    head_size = PyBytes_GET_SIZE(route->head);
    if (size < head_size || memcmp(buf, PyBytes_AS_STRING(route->head), head_size) != 0)
        goto decline;
    p = buf + head_size;
    end = memchr(p, '\n', size - head_size);
    if (end == NULL)
        goto decline;
    offset_start = p;
    while (p < end && *p >= '0' && *p <= '9') {
        if (p - offset_start >= 18)
            goto decline; /* past what a long long holds surely */
        offset = offset * 10 + (*p - '0');
        p++;
    }
    if (p == offset_start || p >= end || *p != ' ')
        goto decline;
    epoch_start = ++p;
    while (p < end && *p != ' ')
        p++;
    if (p >= end || p - epoch_start != PyBytes_GET_SIZE(route->epoch) ||
        memcmp(epoch_start, PyBytes_AS_STRING(route->epoch), p - epoch_start) != 0)
        goto decline;
    p++; /* the excluded socket id: none ("-") */
    if (end - p != 1 || *p != '-')
        goto decline;
    if (offset != route->offset + 1)
        goto decline;

    /* The connection and its socket. */
    {
        int ok = attr_is(route->conn, str_state, route->open_state);
        if (ok > 0)
            ok = attr_is(route->conn, str_pending, Py_None);
        if (ok > 0) {
            ok = attr_true(route->conn, str_oversized);
            ok = ok < 0 ? ok : !ok;
        }
        if (ok > 0) {
            ok = attr_true(route->raw, str_close_sent);
            ok = ok < 0 ? ok : !ok;
        }
        if (ok > 0) {
            ok = attr_true(route->raw, str_disconnected);
            ok = ok < 0 ? ok : !ok;
        }
        if (ok > 0) {
            PyObject *closing = PyObject_CallMethodNoArgs(route->transport, str_is_closing);
            if (closing == NULL)
                ok = -1;
            else {
                ok = PyObject_IsTrue(closing);
                ok = ok < 0 ? ok : !ok;
                Py_DECREF(closing);
            }
        }
        if (ok < 0)
            goto error;
        if (!ok)
            goto decline;
    }
    payload = size - (end - buf) - 1;
    header = payload < 126 ? 2 : payload < 65536 ? 4 : 10;
    {
        PyObject *held = PyObject_CallMethodNoArgs(route->transport, str_get_write_buffer_size);
        if (held == NULL)
            goto error;
        buffered = PyLong_AsSsize_t(held);
        Py_DECREF(held);
        if (buffered == -1 && PyErr_Occurred())
            goto error;
    }
    if (buffered + header + payload > route->limit)
        goto decline;

    frame = PyBytes_FromStringAndSize(NULL, header + payload);
    if (frame == NULL)
        goto error;
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
    memcpy(out + header, end + 1, payload);
    result = PyObject_CallMethodOneArg(route->transport, str_write, frame);
    Py_DECREF(frame);
    if (result == NULL)
        goto error;
    Py_DECREF(result);
    route->offset += 1;
    Py_DECREF(route);
    Py_RETURN_TRUE;

decline:
    Py_DECREF(route);
    DECLINE;
error:
    Py_DECREF(route);
    return NULL;
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
