#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "util.h"

static uint64_t clock_us(clockid_t id)
{
	struct timespec ts;

	clock_gettime(id, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

uint64_t util_now_us(void)
{
	return clock_us(CLOCK_MONOTONIC);
}

uint64_t util_now_ms(void)
{
	return clock_us(CLOCK_MONOTONIC) / 1000u;
}

uint64_t util_wall_us(void)
{
	return clock_us(CLOCK_REALTIME);
}

static uint64_t rand_state;

uint64_t util_rand64(void)
{
	/* xorshift64*: jitter and tokens need spread, not secrecy (the proof token only has to differ
	 * from what a stale peer could have written). */
	if (!rand_state) {
		if (getrandom(&rand_state, sizeof(rand_state), 0) != sizeof(rand_state) || !rand_state)
			rand_state = util_wall_us() | 1;
	}
	rand_state ^= rand_state >> 12;
	rand_state ^= rand_state << 25;
	rand_state ^= rand_state >> 27;
	return rand_state * 2685821657736338717ull;
}

uint64_t util_rand_below(uint64_t bound)
{
	return bound ? util_rand64() % bound : 0;
}

size_t util_strlcpy(char *dst, const char *src, size_t size)
{
	size_t n = strlen(src);

	if (size) {
		size_t c = n < size - 1 ? n : size - 1;

		memcpy(dst, src, c);
		dst[c] = '\0';
	}
	return n;
}
