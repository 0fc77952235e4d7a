/*
 * What the fuzz targets share: the libFuzzer entry point, declared so that the gcc build
 * (-Wmissing-prototypes) compiles the targets into the replay driver, and a check that stays on
 * in release builds (NDEBUG), aborts, and so becomes a libFuzzer crash with a saved reproducer.
 */
#ifndef MESH_TESTS_FUZZ_H
#define MESH_TESTS_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond)                                                                           \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "%s:%d: %s: invariant violated: %s\n", __FILE__, __LINE__, \
				__func__, #cond);                                                  \
			abort();                                                                   \
		}                                                                                  \
	} while (0)

/* A copy of data in a heap buffer of exactly size bytes, so that ASan reports any read past the
 * end (a 0-byte allocation under ASan is a valid zero-byte region). Aborts when out of memory: a fuzz target
 * has no error path. */
static inline uint8_t *fuzz_dup(const uint8_t *data, size_t size)
{
	uint8_t *p = calloc(size, 1); /* calloc: gcc sees a 0-byte copy as initialised */

	FUZZ_CHECK(p != NULL || size == 0);
	if (size)
		memcpy(p, data, size);
	return p;
}

/* Big-endian reads, written out byte by byte so that they do not share code with the decoders. */
static inline uint32_t fuzz_be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static inline uint64_t fuzz_be64(const uint8_t *p)
{
	return (uint64_t)fuzz_be32(p) << 32 | fuzz_be32(p + 4);
}

#endif
