/*
 * The process_* metrics that Prometheus client libraries export for their process (client_golang's
 * process collector, with its names and help texts, so dashboards made for them work): CPU time,
 * memory, descriptors and start time of meshd, from /proc/self and getrlimit. A family whose
 * source cannot be read is left out, as those libraries do.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "metrics.h"

int metrics_proc_stat_parse(const char *stat, long ticks_per_s, long page_size, uint64_t boot_s,
			    struct metrics_proc *out)
{
	/* The fields after the command (field 2, in parentheses, which may hold anything, ')' too):
	 * 3 state, ... 14 utime, 15 stime, ... 22 starttime (ticks after boot), 23 vsize (bytes), 24 rss
	 * (pages). proc(5). */
	unsigned long long f[25];
	const char *p = strrchr(stat, ')');
	char *end;

	if (!p || p[1] != ' ' || !p[2] || p[3] != ' ' || ticks_per_s <= 0 || page_size <= 0)
		return -EINVAL;
	p += 4; /* past ") S " */
	for (int i = 4; i < 25; i++) {
		errno = 0;
		f[i] = strtoull(p, &end, 10); /* a negative field (tty_nr, tpgid) is none of ours */
		if (end == p || errno || (*end != ' ' && *end != '\n' && *end != '\0'))
			return -EINVAL;
		p = end;
	}
	out->cpu_seconds = (double)(f[14] + f[15]) / (double)ticks_per_s;
	out->start_time_s = (double)boot_s + (double)f[22] / (double)ticks_per_s;
	out->virtual_bytes = f[23];
	out->resident_bytes = f[24] * (unsigned long long)page_size;
	return 0;
}

/* The boot time (btime of /proc/stat, seconds since the epoch); 0 when unknown. It never changes:
 * read once (the renderer runs on one thread, under the daemon's lock). */
static uint64_t boot_time_s(void)
{
	static uint64_t boot_s;
	static bool tried;
	char line[256];
	FILE *f;

	if (tried)
		return boot_s;
	tried = true;
	f = fopen("/proc/stat", "re");
	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f)) /* the long lines (intr) come in pieces: none starts "btime" */
		if (!strncmp(line, "btime ", 6)) {
			boot_s = strtoull(line + 6, NULL, 10);
			break;
		}
	fclose(f);
	return boot_s;
}

static int read_self_stat(struct metrics_proc *out)
{
	char buf[1024];
	ssize_t n;
	int fd, ret;

	fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	n = read(fd, buf, sizeof(buf) - 1);
	ret = n < 0 ? -errno : 0;
	close(fd);
	if (ret)
		return ret;
	buf[n] = '\0';
	return metrics_proc_stat_parse(buf, sysconf(_SC_CLK_TCK), sysconf(_SC_PAGESIZE), boot_time_s(), out);
}

/* Descriptors open now, the directory's own left out; negative errno when /proc is not there. */
static long open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	const struct dirent *e;
	long n = 0;

	if (!d)
		return -errno;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n - 1;
}

void metrics_render_process(struct metrics_buf *b)
{
	struct metrics_proc p;
	struct rlimit rl;
	long fds = open_fds();

	if (!read_self_stat(&p)) {
		metrics_buf_printf(b, "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n"
				      "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total %.2f\n",
				   p.cpu_seconds);
		metrics_buf_printf(b, "# HELP process_virtual_memory_bytes Virtual memory size in bytes.\n"
				      "# TYPE process_virtual_memory_bytes gauge\nprocess_virtual_memory_bytes %llu\n",
				   (unsigned long long)p.virtual_bytes);
		metrics_buf_printf(b, "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
				      "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes %llu\n",
				   (unsigned long long)p.resident_bytes);
		if (boot_time_s())
			metrics_buf_printf(b, "# HELP process_start_time_seconds Start time of the process since unix "
					      "epoch in seconds.\n# TYPE process_start_time_seconds gauge\n"
					      "process_start_time_seconds %.2f\n",
					   p.start_time_s);
	}
	if (fds >= 0)
		metrics_buf_printf(b, "# HELP process_open_fds Number of open file descriptors.\n"
				      "# TYPE process_open_fds gauge\nprocess_open_fds %ld\n",
				   fds);
	if (!getrlimit(RLIMIT_NOFILE, &rl)) {
		metrics_buf_printf(b, "# HELP process_max_fds Maximum number of open file descriptors.\n"
				      "# TYPE process_max_fds gauge\n");
		if (rl.rlim_cur == RLIM_INFINITY)
			metrics_buf_printf(b, "process_max_fds +Inf\n");
		else
			metrics_buf_printf(b, "process_max_fds %llu\n", (unsigned long long)rl.rlim_cur);
	}
}
