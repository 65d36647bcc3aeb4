/*
 * libstagelink as the package finds it at run time (_library.c): opened
 * by path (the package's search, _lib.py), its entry points typed by the
 * installed headers, so the compiler checks every call against them.
 *
 * SPDX-License-Identifier: MIT
 */
#ifndef STAGELINK_PY_LIBRARY_H
#define STAGELINK_PY_LIBRARY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "stagelink/loader.h"
#include "stagelink/stagelink.h"

#define SL_PY_ENTRY(_name) __typeof__(&_name) _name

/* The entry points the binding calls; NULL until open_library. */
typedef struct {
    SL_PY_ENTRY(stagelink_version);
    SL_PY_ENTRY(stagelink_status_string);
    SL_PY_ENTRY(stagelink_loader_open);
    SL_PY_ENTRY(stagelink_loader_plugin);
    SL_PY_ENTRY(stagelink_loader_comm_init);
    SL_PY_ENTRY(stagelink_loader_close);
    SL_PY_ENTRY(stagelink_env_value);
    SL_PY_ENTRY(stagelink_job_query);
} sl_py_library_t;

#undef SL_PY_ENTRY

extern sl_py_library_t sl_py_lib;

/* 0 once libstagelink is open; -1 with ValueError (naming what to call)
 * before. */
int sl_py_library_ready(void);

/* The module functions of this file, for _module.c's table. */
extern PyMethodDef sl_py_library_methods[];

#endif
