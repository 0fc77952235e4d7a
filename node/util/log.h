/*
 * One logging family for meshd and meshctl: checks the level before formatting, keeps errno intact
 * (so "%m" and the caller's errno survive), writes one line to stderr (meshd runs in the foreground
 * under systemd, which timestamps). At debug level each line names the function that wrote it.
 * When stderr is the journal's stream, each line starts with its sd-daemon(3) priority ("<4>"), so
 * journalctl -p filters by level. Debug logging of the data path compiles out unless
 * MESH_DEBUG_LOG is defined.
 */
#ifndef MESH_UTIL_LOG_H
#define MESH_UTIL_LOG_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>

enum log_level { LOG_LVL_ERROR, LOG_LVL_WARN, LOG_LVL_INFO, LOG_LVL_DEBUG };

extern enum log_level log_current_level;

void log_set_level(enum log_level lvl);
/* "error" | "warn" | "info" | "debug" -> level; -EINVAL for anything else. */
int log_level_parse(const char *name);
const char *log_level_name(enum log_level lvl);
/* A prefix for every line, e.g. "meshd[3]". */
void log_set_prefix(const char *prefix);
/* Stamp every line with the monotonic clock's seconds (CLOCK_MONOTONIC, as in the kernel's log):
 * for logs that no journal timestamps, such as a test's, where the order of two meshd's lines in
 * time is what a failure's story needs. */
void log_set_timestamps(bool on);
/* Whether stderr is the journal's stream: systemd puts "DEV:INODE" of a service's stderr in
 * $JOURNAL_STREAM (sd_journal_stream_fd(3), systemd.exec(5)); a child whose stderr was redirected
 * inherits the variable but not the stream, so fd 2's own device and inode must match. When it is,
 * every line starts with its priority ("<3>" error, "<4>" warn, "<6>" info, "<7>" debug) and has no
 * stamp of ours (the journal stamps each line). Call at start, before the first line, and again
 * after redirecting stderr; returns whether it is. */
bool log_journal_detect(void);

void log_write(enum log_level lvl, const char *func, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

#define log_at(lvl, ...)                                                 \
	do {                                                             \
		if ((lvl) <= log_current_level) {                        \
			int log_saved_errno_ = errno;                    \
			log_write((lvl), __func__, __VA_ARGS__);         \
			errno = log_saved_errno_;                        \
		}                                                        \
	} while (0)

#define log_error(...) log_at(LOG_LVL_ERROR, __VA_ARGS__)
#define log_warn(...) log_at(LOG_LVL_WARN, __VA_ARGS__)
#define log_info(...) log_at(LOG_LVL_INFO, __VA_ARGS__)
#define log_debug(...) log_at(LOG_LVL_DEBUG, __VA_ARGS__)
/* A budget for lines that outsiders can cause (a stranger's connection requests): at most `burst`
 * lines per `interval_ms`. Zero-initialise, then set both. */
struct log_ratelimit {
	uint32_t interval_ms;
	uint32_t burst;
	uint64_t start_ms;
	uint32_t n;       /* lines of the current interval */
	uint64_t dropped; /* lines refused since the last one written */
};

/* Whether a line may be written now. When it may, *dropped says how many were refused before
 * it (for one "N lines not logged" line) and is reset. */
bool log_ratelimit_ok(struct log_ratelimit *rl, uint64_t now_ms, uint64_t *dropped);

#ifdef MESH_DEBUG_LOG
#define log_trace(...) log_at(LOG_LVL_DEBUG, __VA_ARGS__)
#else
#define log_trace(...) do { } while (0)
#endif

#endif
