/*
 * Names the compiled part uses, interned once at the module's init (each
 * file keeps a table of its own): torch's public attributes a buffer's
 * description asks for, and the calls a Request names to require_open.
 *
 * SPDX-License-Identifier: MIT
 */
#ifndef STAGELINK_PY_NAMES_H
#define STAGELINK_PY_NAMES_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>

typedef struct {
    PyObject  **name;
    const char *text;
} sl_py_name_t;

/* Interns every name of the table not yet interned; -1 on error. */
static inline int sl_py_intern(const sl_py_name_t *names, size_t count)
{
    size_t i;

    for (i = 0; i < count; ++i) {
        if (*names[i].name == NULL &&
            (*names[i].name = PyUnicode_InternFromString(names[i].text)) ==
                NULL) {
            return -1;
        }
    }
    return 0;
}

#endif
