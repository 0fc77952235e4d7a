/*
 * The log line (node/util/log.c) as stderr receives it: the sd-daemon(3) priority prefix only when
 * $JOURNAL_STREAM names fd 2's own device and inode (as systemd sets it for a service's stderr), no
 * stamp of ours then, and the function that wrote a line only at debug level. Each case points
 * fd 2 at a temp file of its own and reads back what was written.
 */
#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "log.h"
#include "unit_main.h"

/* fd 2 on a temp file while a case logs; cmocka's own messages go back to the real stderr before
 * any assertion. */
struct capture {
	FILE *file;
	int saved_fd;
	char text[4096];
};

static int capture_setup(void **state)
{
	struct capture *c = calloc(1, sizeof(*c));

	if (!c)
		return -1;
	c->file = tmpfile();
	if (!c->file) {
		free(c);
		return -1;
	}
	fflush(stderr);
	c->saved_fd = dup(2);
	if (c->saved_fd < 0 || dup2(fileno(c->file), 2) < 0) {
		fclose(c->file);
		free(c);
		return -1;
	}
	unsetenv("JOURNAL_STREAM");
	log_set_prefix("meshd[7]");
	log_set_level(LOG_LVL_INFO);
	log_set_timestamps(false);
	log_journal_detect();
	*state = c;
	return 0;
}

/* Puts stderr back and returns what the case wrote to it. */
static const char *capture_end(struct capture *c)
{
	size_t n;

	fflush(stderr);
	if (c->saved_fd >= 0) {
		dup2(c->saved_fd, 2);
		close(c->saved_fd);
		c->saved_fd = -1;
	}
	rewind(c->file);
	n = fread(c->text, 1, sizeof(c->text) - 1, c->file);
	c->text[n] = '\0';
	return c->text;
}

static int capture_teardown(void **state)
{
	struct capture *c = *state;

	capture_end(c);
	fclose(c->file);
	free(c);
	unsetenv("JOURNAL_STREAM");
	log_journal_detect();
	log_set_level(LOG_LVL_INFO);
	return 0;
}

/* $JOURNAL_STREAM as systemd would set it for the file now on fd 2, its inode moved by ino_delta. */
static void journal_stream_set(int ino_delta)
{
	struct stat st;
	char v[64];

	assert_int_equal(fstat(2, &st), 0);
	snprintf(v, sizeof(v), "%ju:%ju", (uintmax_t)st.st_dev, (uintmax_t)st.st_ino + (uintmax_t)ino_delta);
	assert_int_equal(setenv("JOURNAL_STREAM", v, 1), 0);
}

static void log_four_levels(void)
{
	log_error("e %d", 3);
	log_warn("w %d", 4);
	log_info("i %d", 6);
	log_debug("d %d", 7);
}

static void log_journal_detect__stream_is_fd_2__priority_prefix_per_level(void **state)
{
	struct capture *c = *state;
	bool on;

	journal_stream_set(0);
	on = log_journal_detect();
	log_four_levels();
	capture_end(c);
	assert_true(on);
	assert_string_equal(c->text, "<3>meshd[7] error: e 3\n"
				     "<4>meshd[7] warn: w 4\n"
				     "<6>meshd[7] info: i 6\n");
}

static void log_journal_detect__stream_and_debug__debug_prefix_and_function_names(void **state)
{
	struct capture *c = *state;

	journal_stream_set(0);
	log_journal_detect();
	log_set_level(LOG_LVL_DEBUG);
	log_warn("w");
	log_debug("d");
	capture_end(c);
	assert_string_equal(c->text, "<4>meshd[7] warn: log_journal_detect__stream_and_debug__debug_prefix_and_function_names: w\n"
				     "<7>meshd[7] debug: log_journal_detect__stream_and_debug__debug_prefix_and_function_names: d\n");
}

/* The journal stamps each line itself; MESH_LOG_TIME's stamp would only be noise there. */
static void log_journal_detect__stream_and_timestamps__no_stamp_of_ours(void **state)
{
	struct capture *c = *state;

	journal_stream_set(0);
	log_journal_detect();
	log_set_timestamps(true);
	log_info("i");
	log_set_timestamps(false);
	capture_end(c);
	assert_string_equal(c->text, "<6>meshd[7] info: i\n");
}

/* A child that inherited $JOURNAL_STREAM with its stderr sent elsewhere (a file, a pipe). */
static void log_journal_detect__stream_names_another_inode__no_prefix(void **state)
{
	struct capture *c = *state;
	bool on;

	journal_stream_set(1);
	on = log_journal_detect();
	log_four_levels();
	capture_end(c);
	assert_false(on);
	assert_string_equal(c->text, "meshd[7] error: e 3\nmeshd[7] warn: w 4\nmeshd[7] info: i 6\n");
}

static void log_journal_detect__unset_or_malformed__no_prefix(void **state)
{
	struct capture *c = *state;
	static const char *const bad[] = {"", "12", "12:", ":34", "a:b", "1:2:3", "1:2x"};
	struct stat st;
	char v[64];
	bool any = false;

	unsetenv("JOURNAL_STREAM");
	any |= log_journal_detect();
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		setenv("JOURNAL_STREAM", bad[i], 1);
		any |= log_journal_detect();
	}
	/* fd 2's own numbers with something after them. */
	fstat(2, &st);
	snprintf(v, sizeof(v), "%ju:%ju:", (uintmax_t)st.st_dev, (uintmax_t)st.st_ino);
	setenv("JOURNAL_STREAM", v, 1);
	any |= log_journal_detect();
	log_info("i");
	capture_end(c);
	assert_false(any);
	assert_string_equal(c->text, "meshd[7] info: i\n");
}

/* The function names are for whoever reads the code beside a debug log, not for an operator. */
static void log_write__info_level__no_function_name(void **state)
{
	struct capture *c = *state;

	log_four_levels();
	capture_end(c);
	assert_string_equal(c->text, "meshd[7] error: e 3\nmeshd[7] warn: w 4\nmeshd[7] info: i 6\n");
	assert_null(strstr(c->text, __func__));
}

static void log_write__debug_level__function_name_on_every_line(void **state)
{
	struct capture *c = *state;

	log_set_level(LOG_LVL_DEBUG);
	log_error("e");
	log_info("i");
	log_debug("d");
	capture_end(c);
	assert_string_equal(c->text, "meshd[7] error: log_write__debug_level__function_name_on_every_line: e\n"
				     "meshd[7] info: log_write__debug_level__function_name_on_every_line: i\n"
				     "meshd[7] debug: log_write__debug_level__function_name_on_every_line: d\n");
}

static void log_write__timestamps_without_journal__monotonic_stamp(void **state)
{
	struct capture *c = *state;
	unsigned long long s;
	unsigned us;
	char rest[64];

	log_set_timestamps(true);
	log_warn("w");
	log_set_timestamps(false);
	capture_end(c);
	assert_int_equal(sscanf(c->text, "[%llu.%6u] %63[^\n]", &s, &us, rest), 3);
	assert_string_equal(rest, "meshd[7] warn: w");
}

/* errno survives a line, so "%m" and the caller's errno after it both still mean the failure. */
static void log_write__any_line__errno_kept(void **state)
{
	struct capture *c = *state;

	errno = ECONNRESET;
	log_warn("lost: %m");
	assert_int_equal(errno, ECONNRESET);
	capture_end(c);
	assert_string_equal(c->text, "meshd[7] warn: lost: Connection reset by peer\n");
}

#define T(f) cmocka_unit_test_setup_teardown(f, capture_setup, capture_teardown)

static const struct CMUnitTest tests[] = {
	T(log_journal_detect__stream_is_fd_2__priority_prefix_per_level),
	T(log_journal_detect__stream_and_debug__debug_prefix_and_function_names),
	T(log_journal_detect__stream_and_timestamps__no_stamp_of_ours),
	T(log_journal_detect__stream_names_another_inode__no_prefix),
	T(log_journal_detect__unset_or_malformed__no_prefix),
	T(log_write__info_level__no_function_name),
	T(log_write__debug_level__function_name_on_every_line),
	T(log_write__timestamps_without_journal__monotonic_stamp),
	T(log_write__any_line__errno_kept),
};

UNIT_MAIN("log", tests, NULL, NULL)
