#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <time.h>

#include "log.h"

enum log_level log_current_level = LOG_LVL_INFO;
static char log_prefix[64] = "mesh";
static bool log_timestamps;
static bool log_journal;

static const char *const log_names[] = {"error", "warn", "info", "debug"};
/* sd-daemon(3)'s prefixes, which journald reads as the line's priority (syslog's numbers). */
static const char *const log_sd_prio[] = {SD_ERR, SD_WARNING, SD_INFO, SD_DEBUG};

void log_set_level(enum log_level lvl)
{
	log_current_level = lvl;
}

int log_level_parse(const char *name)
{
	for (int i = 0; i < (int)(sizeof(log_names) / sizeof(log_names[0])); i++)
		if (!strcmp(name, log_names[i]))
			return i;
	return -EINVAL;
}

const char *log_level_name(enum log_level lvl)
{
	return (unsigned)lvl < sizeof(log_names) / sizeof(log_names[0]) ? log_names[lvl] : "?";
}

void log_set_prefix(const char *prefix)
{
	snprintf(log_prefix, sizeof(log_prefix), "%s", prefix);
}

void log_set_timestamps(bool on)
{
	log_timestamps = on;
}

bool log_journal_detect(void)
{
	const char *v = getenv("JOURNAL_STREAM");
	uintmax_t dev, ino;
	struct stat st;
	char end;

	log_journal = v && sscanf(v, "%ju:%ju%c", &dev, &ino, &end) == 2 && !fstat(2, &st) &&
		      (uintmax_t)st.st_dev == dev && (uintmax_t)st.st_ino == ino;
	return log_journal;
}

void log_write(enum log_level lvl, const char *func, const char *fmt, ...)
{
	char line[1024], stamp[32] = "";
	int n;
	va_list ap;

	if (log_journal)
		snprintf(stamp, sizeof(stamp), "%s", log_sd_prio[lvl]);
	else if (log_timestamps) {
		struct timespec ts;

		clock_gettime(CLOCK_MONOTONIC, &ts);
		snprintf(stamp, sizeof(stamp), "[%5lld.%06ld] ", (long long)ts.tv_sec, ts.tv_nsec / 1000);
	}
	/* The function is for whoever reads the code beside the log: at debug level only. */
	if (log_current_level >= LOG_LVL_DEBUG)
		n = snprintf(line, sizeof(line), "%s%s %s: %s: ", stamp, log_prefix, log_names[lvl], func);
	else
		n = snprintf(line, sizeof(line), "%s%s %s: ", stamp, log_prefix, log_names[lvl]);
	va_start(ap, fmt);
	if (n >= 0 && (size_t)n < sizeof(line))
		vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
	va_end(ap);
	/* One fputs per line keeps lines whole when several meshd share a terminal or a log file. */
	fprintf(stderr, "%s\n", line);
}

bool log_ratelimit_ok(struct log_ratelimit *rl, uint64_t now_ms, uint64_t *dropped)
{
	if (!rl->start_ms || now_ms - rl->start_ms >= rl->interval_ms) {
		rl->start_ms = now_ms ? now_ms : 1;
		rl->n = 0;
	}
	if (rl->n >= rl->burst) {
		rl->dropped++;
		return false;
	}
	rl->n++;
	*dropped = rl->dropped;
	rl->dropped = 0;
	return true;
}
