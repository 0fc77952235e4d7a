/*
 * Diagnostics for contract violations by meshd. A library does not write to stderr on its own:
 * with MESH_DEBUG=1 in the environment, each violation is named once, where it is detected.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "internal.h"

void lib_debug(const char *fmt, ...)
{
	const char *e = getenv("MESH_DEBUG");
	va_list ap;

	if (!e || !*e || *e == '0')
		return;
	va_start(ap, fmt);
	fputs("libmesh: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}
