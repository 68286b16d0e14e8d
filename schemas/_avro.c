/* Avro binary encoding and decoding for the schemas litstream ships, compiled once per schema.
 *
 * schemas/avro_fast.py turns a parsed schema into a program (nested tuples, see compile_node below); Program
 * objects walk Python values against it. Byte for byte the same encoding as fastavro (tests/test_avro_fast.py
 * checks both ways on generated records); fastavro stays the codec for everything a program does not cover
 * (schema resolution between versions, types the project does not use).
 *
 * Records are read from dicts (keyed by Avro field name) or from model objects (their __dict__, keyed by
 * attribute name, JSON fields dumped on the way out); decoding gives dicts, or model objects built without
 * validation (the log holds only records that were validated where they were made).
 *
 * Corrupt input raises AvroError (a ValueError) with the reason; nothing here trusts a length it reads.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

enum Kind { K_NULL, K_BOOLEAN, K_INT, K_LONG, K_FLOAT, K_DOUBLE, K_BYTES, K_STRING, K_ENUM, K_ARRAY, K_MAP,
            K_UNION, K_RECORD };

static const char *KIND_NAMES[] = {"null", "boolean", "int", "long", "float", "double", "bytes", "string", "enum",
                                   "array", "map", "union", "record"};

typedef struct Node Node;

#define MAX_FIELDS 64  /* per record: decoding keeps a record's values on the stack */

typedef struct {
    PyObject *wire_name;  /* key in a wire dict */
    PyObject *attr_name;  /* key in a model's __dict__ */
    Node *node;
    int json;             /* model attribute travels as JSON text */
    PyObject *default_;   /* wire default (NULL: none) */
    PyObject *json_default;  /* JSON text a model takes when the wire holds null (NULL: none) */
} Field;

struct Node {
    int kind;
    PyObject *symbols;       /* enum: tuple of str */
    PyObject *symbol_index;  /* enum: dict str -> int */
    Node *items;             /* array items, map values */
    Py_ssize_t nbranches;    /* union */
    Node **branches;
    PyObject *branch_names;  /* union: tuple of str (fastavro's tuple notation) */
    Py_ssize_t nfields;      /* record */
    Field *fields;
    Py_ssize_t *dict_order;  /* record: field indices in the order the decoded dict is filled */
    PyObject *cls;           /* record: model class to build on decode, or NULL for a dict */
    PyObject *fields_set;    /* record: frozenset of attribute names */
};

static PyObject *AvroError;
static PyObject *s_dict;      /* "__dict__" */
static PyObject *s_fields_set, *s_extra, *s_private;
static PyObject *empty_tuple;

/* ---------------------------------------------------------------------------------------------------------- */
/* Programs: from nested tuples to a Node tree                                                                  */

static void free_node(Node *n) {
    if (n == NULL) return;
    Py_XDECREF(n->symbols);
    Py_XDECREF(n->symbol_index);
    free_node(n->items);
    for (Py_ssize_t i = 0; i < n->nbranches; i++) free_node(n->branches[i]);
    PyMem_Free(n->branches);
    Py_XDECREF(n->branch_names);
    for (Py_ssize_t i = 0; i < n->nfields; i++) {
        Field *f = &n->fields[i];
        Py_XDECREF(f->wire_name);
        Py_XDECREF(f->attr_name);
        free_node(f->node);
        Py_XDECREF(f->default_);
        Py_XDECREF(f->json_default);
    }
    PyMem_Free(n->fields);
    PyMem_Free(n->dict_order);
    Py_XDECREF(n->cls);
    Py_XDECREF(n->fields_set);
    PyMem_Free(n);
}

static int kind_of(PyObject *name) {
    for (int k = 0; k < (int)(sizeof KIND_NAMES / sizeof *KIND_NAMES); k++)
        if (PyUnicode_CompareWithASCIIString(name, KIND_NAMES[k]) == 0) return k;
    return -1;
}

/* ("null",) ("boolean",) ("int",) ("long",) ("float",) ("double",) ("bytes",) ("string",)
 * ("enum", symbols) ("array", items) ("map", values) ("union", branches, branch_names)
 * ("record", cls | None, fields_set | None, fields, dict_order)
 *    field: (wire_name, attr_name, node, json, default | missing, json_default | None)
 *    missing: the module's MISSING sentinel, passed as compile()'s second argument */
static Node *compile_node(PyObject *spec, PyObject *missing) {
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) < 1 || !PyUnicode_Check(PyTuple_GET_ITEM(spec, 0))) {
        PyErr_SetString(PyExc_TypeError, "program node must be a tuple starting with its kind");
        return NULL;
    }
    int kind = kind_of(PyTuple_GET_ITEM(spec, 0));
    if (kind < 0) {
        PyErr_Format(PyExc_ValueError, "unknown program node kind %R", PyTuple_GET_ITEM(spec, 0));
        return NULL;
    }
    Node *n = PyMem_Calloc(1, sizeof(Node));
    if (n == NULL) return (Node *)PyErr_NoMemory();
    n->kind = kind;
    Py_ssize_t size = PyTuple_GET_SIZE(spec);
    switch (kind) {
    case K_ENUM: {
        if (size != 2 || !PyTuple_Check(PyTuple_GET_ITEM(spec, 1))) goto bad;
        n->symbols = Py_NewRef(PyTuple_GET_ITEM(spec, 1));
        n->symbol_index = PyDict_New();
        if (n->symbol_index == NULL) goto fail;
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(n->symbols); i++) {
            PyObject *idx = PyLong_FromSsize_t(i);
            if (idx == NULL || PyDict_SetItem(n->symbol_index, PyTuple_GET_ITEM(n->symbols, i), idx) < 0) {
                Py_XDECREF(idx);
                goto fail;
            }
            Py_DECREF(idx);
        }
        break;
    }
    case K_ARRAY:
    case K_MAP:
        if (size != 2) goto bad;
        if ((n->items = compile_node(PyTuple_GET_ITEM(spec, 1), missing)) == NULL) goto fail;
        break;
    case K_UNION: {
        if (size != 3 || !PyTuple_Check(PyTuple_GET_ITEM(spec, 1)) || !PyTuple_Check(PyTuple_GET_ITEM(spec, 2)))
            goto bad;
        PyObject *branches = PyTuple_GET_ITEM(spec, 1);
        n->branch_names = Py_NewRef(PyTuple_GET_ITEM(spec, 2));
        if (PyTuple_GET_SIZE(n->branch_names) != PyTuple_GET_SIZE(branches)) goto bad;
        n->branches = PyMem_Calloc(PyTuple_GET_SIZE(branches) + 1, sizeof(Node *));
        if (n->branches == NULL) goto fail;
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(branches); i++) {
            n->nbranches = i + 1;
            if ((n->branches[i] = compile_node(PyTuple_GET_ITEM(branches, i), missing)) == NULL) goto fail;
        }
        break;
    }
    case K_RECORD: {
        if (size != 5 || !PyTuple_Check(PyTuple_GET_ITEM(spec, 3)) || !PyTuple_Check(PyTuple_GET_ITEM(spec, 4)))
            goto bad;
        PyObject *cls = PyTuple_GET_ITEM(spec, 1), *fields_set = PyTuple_GET_ITEM(spec, 2);
        PyObject *fields = PyTuple_GET_ITEM(spec, 3), *order = PyTuple_GET_ITEM(spec, 4);
        if (cls != Py_None) {
            if (!PyType_Check(cls) || !PyAnySet_Check(fields_set)) goto bad;
            n->cls = Py_NewRef(cls);
            n->fields_set = Py_NewRef(fields_set);
        }
        Py_ssize_t nf = PyTuple_GET_SIZE(fields);
        if (PyTuple_GET_SIZE(order) != nf || nf > MAX_FIELDS) goto bad;
        n->fields = PyMem_Calloc(nf + 1, sizeof(Field));
        n->dict_order = PyMem_Calloc(nf + 1, sizeof(Py_ssize_t));
        if (n->fields == NULL || n->dict_order == NULL) goto fail;
        for (Py_ssize_t i = 0; i < nf; i++) {
            PyObject *f = PyTuple_GET_ITEM(fields, i);
            if (!PyTuple_Check(f) || PyTuple_GET_SIZE(f) != 6) goto bad;
            n->nfields = i + 1;
            Field *field = &n->fields[i];
            field->wire_name = Py_NewRef(PyTuple_GET_ITEM(f, 0));
            field->attr_name = Py_NewRef(PyTuple_GET_ITEM(f, 1));
            if (!PyUnicode_Check(field->wire_name) || !PyUnicode_Check(field->attr_name)) goto bad;
            field->json = PyObject_IsTrue(PyTuple_GET_ITEM(f, 3));
            if (PyTuple_GET_ITEM(f, 4) != missing) field->default_ = Py_NewRef(PyTuple_GET_ITEM(f, 4));
            if (PyTuple_GET_ITEM(f, 5) != Py_None) field->json_default = Py_NewRef(PyTuple_GET_ITEM(f, 5));
            if ((field->node = compile_node(PyTuple_GET_ITEM(f, 2), missing)) == NULL) goto fail;
        }
        for (Py_ssize_t i = 0; i < nf; i++) {
            Py_ssize_t j = PyLong_AsSsize_t(PyTuple_GET_ITEM(order, i));
            if (j < 0 || j >= nf) {
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "dict order index out of range");
                goto fail;
            }
            n->dict_order[i] = j;
        }
        break;
    }
    default:
        if (size != 1) goto bad;
    }
    return n;
bad:
    if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "malformed %s program node", KIND_NAMES[kind]);
fail:
    free_node(n);
    return NULL;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* Encoding                                                                                                     */

typedef struct {
    char *data;
    Py_ssize_t len, cap;
    PyObject *dumps;
} Writer;

static int grow(Writer *w, Py_ssize_t need) {
    if (w->len + need <= w->cap) return 0;
    Py_ssize_t cap = w->cap * 2;
    if (cap < w->len + need) cap = w->len + need + 256;
    char *data = PyMem_Realloc(w->data, cap);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    w->data = data;
    w->cap = cap;
    return 0;
}

static inline int put_bytes(Writer *w, const char *src, Py_ssize_t n) {
    if (grow(w, n) < 0) return -1;
    memcpy(w->data + w->len, src, n);
    w->len += n;
    return 0;
}

static inline int put_long(Writer *w, long long value) {
    if (grow(w, 10) < 0) return -1;
    unsigned long long z = ((unsigned long long)value << 1) ^ (unsigned long long)(value >> 63);
    unsigned char *p = (unsigned char *)w->data + w->len;
    while (z > 0x7F) {
        *p++ = (unsigned char)((z & 0x7F) | 0x80);
        z >>= 7;
    }
    *p++ = (unsigned char)z;
    w->len = (char *)p - w->data;
    return 0;
}

static int encode(Writer *w, Node *n, PyObject *v);

static int wrong_type(Node *n, PyObject *v) {
    PyErr_Format(PyExc_TypeError, "%s value expected, got %.100s %.200R", KIND_NAMES[n->kind], Py_TYPE(v)->tp_name,
                 v);
    return -1;
}

static int put_string(Writer *w, PyObject *v) {
    Py_ssize_t size;
    const char *utf8 = PyUnicode_AsUTF8AndSize(v, &size);
    if (utf8 == NULL) return -1;
    if (put_long(w, size) < 0) return -1;
    return put_bytes(w, utf8, size);
}

/* Does v fit branch b of a union? The same tests, in branch order, as fastavro's writer. */
static int fits(Node *b, PyObject *v) {
    switch (b->kind) {
    case K_NULL: return v == Py_None;
    case K_BOOLEAN: return PyBool_Check(v);
    case K_INT:
    case K_LONG: {
        if (!PyLong_Check(v) || PyBool_Check(v)) return 0;
        int overflow;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow) return 0;
        return b->kind == K_LONG || (x >= INT32_MIN && x <= INT32_MAX);
    }
    case K_FLOAT:
    case K_DOUBLE: return (PyFloat_Check(v) || PyLong_Check(v)) && !PyBool_Check(v);
    case K_BYTES: return PyBytes_Check(v);
    case K_STRING: return PyUnicode_Check(v);
    case K_ENUM: return PyUnicode_Check(v) && PyDict_GetItemWithError(b->symbol_index, v) != NULL;
    case K_ARRAY: return PyList_Check(v) || (PyTuple_Check(v));
    case K_MAP: return PyDict_Check(v);
    case K_RECORD: return PyDict_Check(v) || (b->cls != NULL && PyObject_TypeCheck(v, (PyTypeObject *)b->cls));
    }
    return 0;
}

static int encode_union(Writer *w, Node *n, PyObject *v) {
    /* fastavro's tuple notation: (branch name, value) */
    if (PyTuple_Check(v) && PyTuple_GET_SIZE(v) == 2 && PyUnicode_Check(PyTuple_GET_ITEM(v, 0))) {
        for (Py_ssize_t i = 0; i < n->nbranches; i++) {
            int eq = PyUnicode_Compare(PyTuple_GET_ITEM(n->branch_names, i), PyTuple_GET_ITEM(v, 0));
            if (eq == -1 && PyErr_Occurred()) return -1;
            if (eq == 0) {
                if (put_long(w, i) < 0) return -1;
                return encode(w, n->branches[i], PyTuple_GET_ITEM(v, 1));
            }
        }
    }
    for (Py_ssize_t i = 0; i < n->nbranches; i++) {
        int ok = fits(n->branches[i], v);
        if (PyErr_Occurred()) return -1;
        if (ok) {
            if (put_long(w, i) < 0) return -1;
            return encode(w, n->branches[i], v);
        }
    }
    PyErr_Format(PyExc_ValueError, "%.100s %.200R is not of any type of the union %R", Py_TYPE(v)->tp_name, v,
                 n->branch_names);
    return -1;
}

/* JSON text as json.dumps(value, separators=(",", ":"), ensure_ascii=False) writes it, for the plain values a
 * JSON field holds: exact dict (str keys), list, tuple, str, int, float, bool, None. Returns 1 for anything else
 * (another type, a subclass, a non-str key, a string that is not valid UTF-8, nesting past JSON_DEPTH), and the
 * caller asks Python's json for the whole value, which also gives json's own errors. */
#define JSON_DEPTH 64

static int json_write(Writer *b, PyObject *v, int depth);

static int json_string(Writer *b, PyObject *s) {
    Py_ssize_t n;
    const char *u = PyUnicode_AsUTF8AndSize(s, &n);
    if (u == NULL) {  /* lone surrogates: json copes, UTF-8 cannot */
        PyErr_Clear();
        return 1;
    }
    if (grow(b, n + 2) < 0) return -1;
    b->data[b->len++] = '"';
    Py_ssize_t run = 0;  /* bytes copied as they are, since the last escape */
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)u[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        if (put_bytes(b, u + run, i - run) < 0) return -1;
        run = i + 1;
        char esc[8];
        int len = 2;
        esc[0] = '\\';
        switch (c) {
        case '"': esc[1] = '"'; break;
        case '\\': esc[1] = '\\'; break;
        case '\n': esc[1] = 'n'; break;
        case '\r': esc[1] = 'r'; break;
        case '\t': esc[1] = 't'; break;
        case '\b': esc[1] = 'b'; break;
        case '\f': esc[1] = 'f'; break;
        default: len = snprintf(esc, sizeof esc, "\\u%04x", c);
        }
        if (put_bytes(b, esc, len) < 0) return -1;
    }
    if (put_bytes(b, u + run, n - run) < 0) return -1;
    return put_bytes(b, "\"", 1);
}

static int json_write(Writer *b, PyObject *v, int depth) {
    if (depth > JSON_DEPTH) return 1;
    if (v == Py_None) return put_bytes(b, "null", 4);
    if (v == Py_True) return put_bytes(b, "true", 4);
    if (v == Py_False) return put_bytes(b, "false", 5);
    if (PyUnicode_CheckExact(v)) return json_string(b, v);
    if (PyLong_CheckExact(v)) {
        int overflow;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow) return 1;
        char digits[24];
        return put_bytes(b, digits, snprintf(digits, sizeof digits, "%lld", x));
    }
    if (PyFloat_CheckExact(v)) {
        double x = PyFloat_AS_DOUBLE(v);
        if (x != x) return put_bytes(b, "NaN", 3);
        if (x == Py_HUGE_VAL) return put_bytes(b, "Infinity", 8);
        if (x == -Py_HUGE_VAL) return put_bytes(b, "-Infinity", 9);
        char *repr = PyOS_double_to_string(x, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);  /* float.__repr__ */
        if (repr == NULL) return -1;
        int rc = put_bytes(b, repr, (Py_ssize_t)strlen(repr));
        PyMem_Free(repr);
        return rc;
    }
    if (PyList_CheckExact(v) || PyTuple_CheckExact(v)) {
        Py_ssize_t size = PySequence_Fast_GET_SIZE(v);
        if (put_bytes(b, "[", 1) < 0) return -1;
        for (Py_ssize_t i = 0; i < size; i++) {
            if (i > 0 && put_bytes(b, ",", 1) < 0) return -1;
            /* a list may change under a callback; none runs here, but read its size each time all the same */
            if (i >= PySequence_Fast_GET_SIZE(v)) return 1;
            int rc = json_write(b, PySequence_Fast_GET_ITEM(v, i), depth + 1);
            if (rc != 0) return rc;
        }
        return put_bytes(b, "]", 1);
    }
    if (PyDict_CheckExact(v)) {
        Py_ssize_t pos = 0;
        PyObject *key, *value;
        int first = 1;
        if (put_bytes(b, "{", 1) < 0) return -1;
        while (PyDict_Next(v, &pos, &key, &value)) {
            if (!PyUnicode_CheckExact(key)) return 1;  /* json turns numbers into keys its own way */
            if (!first && put_bytes(b, ",", 1) < 0) return -1;
            first = 0;
            int rc = json_string(b, key);
            if (rc != 0) return rc;
            if (put_bytes(b, ":", 1) < 0) return -1;
            if ((rc = json_write(b, value, depth + 1)) != 0) return rc;
        }
        return put_bytes(b, "}", 1);
    }
    return 1;
}

/* A model's JSON field: its value as JSON text, written as the field's string (or the string branch of its
 * union); what json_write leaves to Python goes through the codec's dumps. */
static int encode_json_field(Writer *w, Node *node, PyObject *value) {
    Py_ssize_t branch = -1;
    if (node->kind == K_UNION) {
        for (Py_ssize_t i = 0; i < node->nbranches; i++)
            if (node->branches[i]->kind == K_STRING) branch = i;
    }
    if (node->kind == K_STRING || branch >= 0) {
        Writer text = {NULL, 0, 0, NULL};
        int rc = json_write(&text, value, 0);
        if (rc == 0) {
            rc = (branch >= 0 && put_long(w, branch) < 0) || put_long(w, text.len) < 0 ||
                 put_bytes(w, text.data, text.len) < 0 ? -1 : 0;
            PyMem_Free(text.data);
            return rc;
        }
        PyMem_Free(text.data);
        if (rc < 0) return -1;
    }
    PyObject *text = PyObject_CallOneArg(w->dumps, value);
    if (text == NULL) return -1;
    int rc = encode(w, node, text);
    Py_DECREF(text);
    return rc;
}

static int encode_record(Writer *w, Node *n, PyObject *v) {
    PyObject *source;
    int from_model = !PyDict_Check(v);
    if (from_model) {
        source = PyObject_GetAttr(v, s_dict);
        if (source == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
            PyErr_Clear();
            return wrong_type(n, v);
        }
        if (!PyDict_Check(source)) {
            Py_DECREF(source);
            return wrong_type(n, v);
        }
    } else {
        source = Py_NewRef(v);
    }
    for (Py_ssize_t i = 0; i < n->nfields; i++) {
        Field *f = &n->fields[i];
        PyObject *value = PyDict_GetItemWithError(source, from_model ? f->attr_name : f->wire_name);
        int rc;
        if (value == NULL) {
            if (PyErr_Occurred()) goto fail;
            if (f->default_ == NULL) {
                PyErr_Format(PyExc_ValueError, "no value for field %U", f->wire_name);
                goto fail;
            }
            value = f->default_;
        }
        if (from_model && f->json) {
            rc = encode_json_field(w, f->node, value);
        } else {
            rc = encode(w, f->node, value);
        }
        if (rc < 0) {
            /* say where: field names from the outside in */
            PyObject *type, *val, *tb;
            PyErr_Fetch(&type, &val, &tb);
            PyErr_NormalizeException(&type, &val, &tb);
            int plain = type == PyExc_ValueError || type == PyExc_TypeError;
            PyObject *msg = plain ? PyUnicode_FromFormat("%U: %S", f->wire_name, val ? val : Py_None) : NULL;
            if (msg != NULL) {
                PyErr_SetObject(type, msg);
                Py_DECREF(msg);
                Py_XDECREF(type);
                Py_XDECREF(val);
                Py_XDECREF(tb);
            } else {
                if (plain) PyErr_Clear();
                PyErr_Restore(type, val, tb);
            }
            goto fail;
        }
    }
    Py_DECREF(source);
    return 0;
fail:
    Py_DECREF(source);
    return -1;
}

static int encode(Writer *w, Node *n, PyObject *v) {
    switch (n->kind) {
    case K_NULL:
        if (v != Py_None) return wrong_type(n, v);
        return 0;
    case K_BOOLEAN: {
        int truth = PyObject_IsTrue(v);
        if (truth < 0) return -1;
        if (grow(w, 1) < 0) return -1;
        w->data[w->len++] = truth ? 1 : 0;
        return 0;
    }
    case K_INT:
    case K_LONG: {
        if (!PyLong_Check(v)) return wrong_type(n, v);
        long long x = PyLong_AsLongLong(v);
        if (x == -1 && PyErr_Occurred()) return -1;
        if (n->kind == K_INT && (x < INT32_MIN || x > INT32_MAX)) {
            PyErr_Format(PyExc_ValueError, "%lld does not fit an Avro int", x);
            return -1;
        }
        return put_long(w, x);
    }
    case K_FLOAT:
    case K_DOUBLE: {
        if (!PyFloat_Check(v) && !PyLong_Check(v)) return wrong_type(n, v);
        double x = PyFloat_AsDouble(v);
        if (x == -1.0 && PyErr_Occurred()) return -1;
        if (n->kind == K_FLOAT) {
            float f = (float)x;
            return put_bytes(w, (const char *)&f, 4); /* little-endian hosts: see avro_fast.available() */
        }
        return put_bytes(w, (const char *)&x, 8);
    }
    case K_BYTES:
        if (!PyBytes_Check(v)) return wrong_type(n, v);
        if (put_long(w, PyBytes_GET_SIZE(v)) < 0) return -1;
        return put_bytes(w, PyBytes_AS_STRING(v), PyBytes_GET_SIZE(v));
    case K_STRING:
        if (!PyUnicode_Check(v)) return wrong_type(n, v);
        return put_string(w, v);
    case K_ENUM: {
        PyObject *idx = PyUnicode_Check(v) ? PyDict_GetItemWithError(n->symbol_index, v) : NULL;
        if (idx == NULL) {
            if (PyErr_Occurred()) return -1;
            PyErr_Format(PyExc_ValueError, "%.200R is not a symbol of %R", v, n->symbols);
            return -1;
        }
        return put_long(w, PyLong_AsLongLong(idx));
    }
    case K_ARRAY: {
        if (!PyList_Check(v) && !PyTuple_Check(v)) return wrong_type(n, v);
        PyObject *seq = PySequence_Fast(v, "array");
        if (seq == NULL) return -1;
        Py_ssize_t size = PySequence_Fast_GET_SIZE(seq);
        int rc = 0;
        if (size > 0) {
            rc = put_long(w, size);
            PyObject **items = PySequence_Fast_ITEMS(seq);
            if (rc == 0 && n->items->kind == K_LONG && (rc = grow(w, 10 * size)) == 0) {  /* token ids */
                for (Py_ssize_t i = 0; i < size; i++) {
                    if (!PyLong_Check(items[i])) {
                        rc = wrong_type(n->items, items[i]);
                        break;
                    }
                    long long x = PyLong_AsLongLong(items[i]);
                    if (x == -1 && PyErr_Occurred()) {
                        rc = -1;
                        break;
                    }
                    put_long(w, x);  /* room made above: cannot fail */
                }
            } else if (rc == 0 && n->items->kind == K_DOUBLE && (rc = grow(w, 8 * size)) == 0) {  /* logprobs */
                for (Py_ssize_t i = 0; i < size; i++) {
                    double x = PyFloat_Check(items[i]) ? PyFloat_AS_DOUBLE(items[i]) : -1.0;
                    if (!PyFloat_Check(items[i])) {
                        if (!PyLong_Check(items[i])) {
                            rc = wrong_type(n->items, items[i]);
                            break;
                        }
                        x = PyFloat_AsDouble(items[i]);
                        if (x == -1.0 && PyErr_Occurred()) {
                            rc = -1;
                            break;
                        }
                    }
                    memcpy(w->data + w->len, &x, 8);
                    w->len += 8;
                }
            } else {
                for (Py_ssize_t i = 0; rc == 0 && i < size; i++) rc = encode(w, n->items, items[i]);
            }
        }
        Py_DECREF(seq);
        return rc < 0 ? -1 : put_long(w, 0);
    }
    case K_MAP: {
        if (!PyDict_Check(v)) return wrong_type(n, v);
        Py_ssize_t size = PyDict_GET_SIZE(v), pos = 0;
        PyObject *key, *value;
        if (size > 0) {
            if (put_long(w, size) < 0) return -1;
            while (PyDict_Next(v, &pos, &key, &value)) {
                if (!PyUnicode_Check(key)) {
                    PyErr_Format(PyExc_TypeError, "map key %.200R is not a string", key);
                    return -1;
                }
                Py_INCREF(value);
                int rc = put_string(w, key) < 0 ? -1 : encode(w, n->items, value);
                Py_DECREF(value);
                if (rc < 0) return -1;
            }
        }
        return put_long(w, 0);
    }
    case K_UNION:
        return encode_union(w, n, v);
    case K_RECORD:
        return encode_record(w, n, v);
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* Decoding                                                                                                     */

typedef struct {
    const unsigned char *p, *end;
    PyObject *loads;
} Reader;

static int corrupt(const char *what) {
    PyErr_SetString(AvroError, what);
    return -1;
}

static inline int get_long(Reader *r, long long *out) {
    unsigned long long z = 0;
    int shift = 0;
    while (1) {
        if (r->p >= r->end) return corrupt("truncated varint");
        unsigned char b = *r->p++;
        if (shift == 63 && (b & 0x7E)) return corrupt("varint too long");
        z |= (unsigned long long)(b & 0x7F) << shift;
        if (!(b & 0x80)) break;
        shift += 7;
        if (shift > 63) return corrupt("varint too long");
    }
    *out = (long long)(z >> 1) ^ -(long long)(z & 1);
    return 0;
}

static int get_length(Reader *r, Py_ssize_t *out) {
    long long n;
    if (get_long(r, &n) < 0) return -1;
    if (n < 0) return corrupt("negative length");
    if (n > r->end - r->p) return corrupt("length past the end of the message");
    *out = (Py_ssize_t)n;
    return 0;
}

static PyObject *decode(Reader *r, Node *n);

/* A length-prefixed UTF-8 string (a string value or a map key); `what` names it in the error. */
static PyObject *read_utf8(Reader *r, const char *what) {
    Py_ssize_t len;
    if (get_length(r, &len) < 0) return NULL;
    PyObject *s = PyUnicode_DecodeUTF8((const char *)r->p, len, "strict");
    r->p += len;
    if (s == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
        PyErr_Clear();
        PyErr_Format(AvroError, "%s is not UTF-8", what);
    }
    return s;
}

/* Block count of an array or map: 0 ends, a negative count is followed by the block's byte size. */
static int get_block(Reader *r, Node *items, Py_ssize_t *count) {
    long long c;
    if (get_long(r, &c) < 0) return -1;
    if (c < 0) {
        long long skip;
        if (c == LLONG_MIN) return corrupt("bad block count");
        c = -c;
        if (get_long(r, &skip) < 0) return -1;
    }
    /* Every item but a null takes at least one byte: a count beyond what is left is corrupt. */
    if (items->kind != K_NULL && c > r->end - r->p) return corrupt("block count past the end of the message");
    if (items->kind == K_NULL && c > 1000000) return corrupt("block count too large");
    *count = (Py_ssize_t)c;
    return 0;
}

static PyObject *build_model(Node *n, PyObject *dict) {
    PyTypeObject *tp = (PyTypeObject *)n->cls;
    PyObject *obj = tp->tp_new(tp, empty_tuple, NULL);
    if (obj == NULL) return NULL;
    PyObject *fields_set = PySet_New(n->fields_set);
    if (fields_set == NULL || PyObject_GenericSetAttr(obj, s_dict, dict) < 0 ||
        PyObject_GenericSetAttr(obj, s_fields_set, fields_set) < 0 ||
        PyObject_GenericSetAttr(obj, s_extra, Py_None) < 0 || PyObject_GenericSetAttr(obj, s_private, Py_None) < 0) {
        Py_XDECREF(fields_set);
        Py_DECREF(obj);
        return NULL;
    }
    Py_DECREF(fields_set);
    return obj;
}

static PyObject *decode_record(Reader *r, Node *n) {
    PyObject *values[MAX_FIELDS];
    Py_ssize_t nf = n->nfields;
    Py_ssize_t done = 0;
    for (; done < nf; done++) {
        Field *f = &n->fields[done];
        PyObject *v = decode(r, f->node);
        if (v == NULL) goto fail;
        if (n->cls != NULL && f->json) {
            PyObject *parsed = v == Py_None ? (f->json_default ? PyObject_CallOneArg(r->loads, f->json_default)
                                                               : Py_NewRef(Py_None))
                                            : PyObject_CallOneArg(r->loads, v);
            Py_DECREF(v);
            if (parsed == NULL) goto fail;
            v = parsed;
        }
        values[done] = v;
    }
    PyObject *dict = _PyDict_NewPresized(nf);
    if (dict == NULL) goto fail;
    for (Py_ssize_t i = 0; i < nf; i++) {
        Py_ssize_t j = n->dict_order[i];
        Field *f = &n->fields[j];
        if (PyDict_SetItem(dict, n->cls != NULL ? f->attr_name : f->wire_name, values[j]) < 0) {
            Py_DECREF(dict);
            goto fail;
        }
    }
    for (Py_ssize_t i = 0; i < nf; i++) Py_DECREF(values[i]);
    if (n->cls == NULL) return dict;
    PyObject *obj = build_model(n, dict);
    Py_DECREF(dict);
    return obj;
fail:
    for (Py_ssize_t i = 0; i < done; i++) Py_DECREF(values[i]);
    return NULL;
}

static PyObject *decode(Reader *r, Node *n) {
    switch (n->kind) {
    case K_NULL:
        Py_RETURN_NONE;
    case K_BOOLEAN:
        if (r->p >= r->end) return corrupt("truncated boolean"), NULL;
        return PyBool_FromLong(*r->p++ != 0);
    case K_INT:
    case K_LONG: {
        long long x;
        if (get_long(r, &x) < 0) return NULL;
        if (n->kind == K_INT && (x < INT32_MIN || x > INT32_MAX)) return corrupt("int out of range"), NULL;
        return PyLong_FromLongLong(x);
    }
    case K_FLOAT: {
        float f;
        if (r->end - r->p < 4) return corrupt("truncated float"), NULL;
        memcpy(&f, r->p, 4);
        r->p += 4;
        return PyFloat_FromDouble((double)f);
    }
    case K_DOUBLE: {
        double d;
        if (r->end - r->p < 8) return corrupt("truncated double"), NULL;
        memcpy(&d, r->p, 8);
        r->p += 8;
        return PyFloat_FromDouble(d);
    }
    case K_BYTES: {
        Py_ssize_t len;
        if (get_length(r, &len) < 0) return NULL;
        const char *start = (const char *)r->p;
        r->p += len;
        return PyBytes_FromStringAndSize(start, len);
    }
    case K_STRING:
        return read_utf8(r, "string");
    case K_ENUM: {
        long long idx;
        if (get_long(r, &idx) < 0) return NULL;
        if (idx < 0 || idx >= PyTuple_GET_SIZE(n->symbols)) return corrupt("enum index out of range"), NULL;
        return Py_NewRef(PyTuple_GET_ITEM(n->symbols, idx));
    }
    case K_ARRAY: {
        PyObject *list = PyList_New(0);
        if (list == NULL) return NULL;
        while (1) {
            Py_ssize_t count;
            if (get_block(r, n->items, &count) < 0) goto array_fail;
            if (count == 0) break;
            if (PyList_GET_SIZE(list) == 0) {  /* the usual single block: the list made at its size */
                PyObject *sized = PyList_New(count);
                if (sized == NULL) goto array_fail;
                Py_DECREF(list);
                list = sized;
                int kind = n->items->kind;
                for (Py_ssize_t i = 0; i < count; i++) {
                    PyObject *item;
                    if (kind == K_LONG) {  /* token ids and log-probs: no dispatch per item */
                        long long x;
                        item = get_long(r, &x) < 0 ? NULL : PyLong_FromLongLong(x);
                    } else if (kind == K_DOUBLE && r->end - r->p >= 8) {
                        double d;
                        memcpy(&d, r->p, 8);
                        r->p += 8;
                        item = PyFloat_FromDouble(d);
                    } else {
                        item = decode(r, n->items);
                    }
                    if (item == NULL) {
                        /* the slots not yet filled are NULL: shrink to what was filled before freeing */
                        Py_SET_SIZE(list, i);
                        goto array_fail;
                    }
                    PyList_SET_ITEM(list, i, item);
                }
                continue;
            }
            for (Py_ssize_t i = 0; i < count; i++) {
                PyObject *item = decode(r, n->items);
                if (item == NULL) goto array_fail;
                int rc = PyList_Append(list, item);
                Py_DECREF(item);
                if (rc < 0) goto array_fail;
            }
        }
        return list;
    array_fail:
        Py_DECREF(list);
        return NULL;
    }
    case K_MAP: {
        PyObject *dict = PyDict_New();
        if (dict == NULL) return NULL;
        while (1) {
            Py_ssize_t count;
            if (get_block(r, n->items, &count) < 0) goto map_fail;
            if (count == 0) break;
            for (Py_ssize_t i = 0; i < count; i++) {
                PyObject *key = read_utf8(r, "map key");
                if (key == NULL) goto map_fail;
                PyObject *value = decode(r, n->items);
                if (value == NULL) {
                    Py_DECREF(key);
                    goto map_fail;
                }
                int rc = PyDict_SetItem(dict, key, value);
                Py_DECREF(key);
                Py_DECREF(value);
                if (rc < 0) goto map_fail;
            }
        }
        return dict;
    map_fail:
        Py_DECREF(dict);
        return NULL;
    }
    case K_UNION: {
        long long idx;
        if (get_long(r, &idx) < 0) return NULL;
        if (idx < 0 || idx >= n->nbranches) return corrupt("union branch out of range"), NULL;
        return decode(r, n->branches[idx]);
    }
    case K_RECORD:
        return decode_record(r, n);
    }
    PyErr_SetString(PyExc_SystemError, "bad node");
    return NULL;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* The Program type                                                                                             */

typedef struct {
    PyObject_HEAD
    Node *root;
    PyObject *dumps, *loads;
} Program;

static void Program_dealloc(Program *self) {
    free_node(self->root);
    Py_XDECREF(self->dumps);
    Py_XDECREF(self->loads);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Program_encode(Program *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyBytes_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "encode(value, header: bytes)");
        return NULL;
    }
    Writer w = {NULL, 0, 0, self->dumps};
    if (put_bytes(&w, PyBytes_AS_STRING(args[1]), PyBytes_GET_SIZE(args[1])) < 0 ||
        encode(&w, self->root, args[0]) < 0) {
        PyMem_Free(w.data);
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(w.data, w.len);
    PyMem_Free(w.data);
    return out;
}

static PyObject *Program_decode(Program *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyLong_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "decode(data: bytes, offset: int)");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    Py_ssize_t offset = PyLong_AsSsize_t(args[1]);
    PyObject *out = NULL;
    if (offset < 0 || offset > view.len) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "offset outside the data");
        goto done;
    }
    Reader r = {(const unsigned char *)view.buf + offset, (const unsigned char *)view.buf + view.len, self->loads};
    out = decode(&r, self->root);
    if (out != NULL && r.p != r.end) {
        Py_CLEAR(out);
        PyErr_Format(AvroError, "%zd trailing bytes", (Py_ssize_t)(r.end - r.p));
    }
done:
    PyBuffer_Release(&view);
    return out;
}

static PyMethodDef Program_methods[] = {
    {"encode", (PyCFunction)(void (*)(void))Program_encode, METH_FASTCALL,
     "encode(value, header) -> header + the value's Avro binary encoding"},
    {"decode", (PyCFunction)(void (*)(void))Program_decode, METH_FASTCALL,
     "decode(data, offset) -> the value encoded from offset to the end of data; AvroError if corrupt"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ProgramType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "litstream.schemas._avro.Program",
    .tp_basicsize = sizeof(Program),
    .tp_dealloc = (destructor)Program_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A compiled Avro schema: encode and decode",
    .tp_methods = Program_methods,
};

static PyObject *compile_program(PyObject *module, PyObject *args) {
    PyObject *spec, *missing, *dumps, *loads;
    if (!PyArg_ParseTuple(args, "OOOO:compile", &spec, &missing, &dumps, &loads)) return NULL;
    Node *root = compile_node(spec, missing);
    if (root == NULL) return NULL;
    Program *p = PyObject_New(Program, &ProgramType);
    if (p == NULL) {
        free_node(root);
        return NULL;
    }
    p->root = root;
    p->dumps = Py_NewRef(dumps);
    p->loads = Py_NewRef(loads);
    return (PyObject *)p;
}

static PyMethodDef module_methods[] = {
    {"compile", compile_program, METH_VARARGS,
     "compile(program, missing, dumps, loads) -> Program (see schemas/avro_fast.py for the program's shape)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef avro_module = {PyModuleDef_HEAD_INIT, "_avro", "Compiled Avro binary codec", -1,
                                         module_methods};

PyMODINIT_FUNC PyInit__avro(void) {
    if (PyType_Ready(&ProgramType) < 0) return NULL;
    PyObject *m = PyModule_Create(&avro_module);
    if (m == NULL) return NULL;
    AvroError = PyErr_NewExceptionWithDoc("litstream.schemas._avro.AvroError",
                                          "Bytes that are not a valid encoding of the schema.", PyExc_ValueError, NULL);
    s_dict = PyUnicode_InternFromString("__dict__");
    s_fields_set = PyUnicode_InternFromString("__pydantic_fields_set__");
    s_extra = PyUnicode_InternFromString("__pydantic_extra__");
    s_private = PyUnicode_InternFromString("__pydantic_private__");
    empty_tuple = PyTuple_New(0);
    if (AvroError == NULL || s_dict == NULL || s_fields_set == NULL || s_extra == NULL || s_private == NULL ||
        empty_tuple == NULL || PyModule_AddObjectRef(m, "AvroError", AvroError) < 0 ||
        PyModule_AddObjectRef(m, "Program", (PyObject *)&ProgramType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
