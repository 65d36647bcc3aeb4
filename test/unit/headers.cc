/* The same check compiled as C++. */
#include "headers.c"
