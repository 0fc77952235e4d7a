/*
 * Replays inputs through a fuzz target without libFuzzer, so that any compiler builds it and ctest
 * runs the committed corpus on every run:
 *
 *   fuzz_replay_<target> PATH...
 *
 * Every PATH is a file or a directory whose regular files (not the hidden ones) are replayed in
 * name order. Each input is passed to LLVMFuzzerTestOneInput in a heap buffer of exactly its size,
 * as libFuzzer does. A target's invariant check aborts; the last "replay:" line names the input.
 * Fails when no input was found, so a missing corpus cannot pass by running nothing.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

static int replay_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	uint8_t *data = NULL;
	long size;
	int ret = -1;

	if (!f) {
		fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
		return -1;
	}
	if (fseek(f, 0, SEEK_END) || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET)) {
		fprintf(stderr, "replay: %s: cannot size: %s\n", path, strerror(errno));
		goto out_close;
	}
	data = malloc((size_t)size);
	if (!data && size) {
		fprintf(stderr, "replay: %s: out of memory for %ld bytes\n", path, size);
		goto out_close;
	}
	if (fread(data, 1, (size_t)size, f) != (size_t)size) {
		fprintf(stderr, "replay: %s: short read\n", path);
		goto out_free;
	}
	printf("replay: %s (%ld bytes)\n", path, size);
	fflush(stdout);
	LLVMFuzzerTestOneInput(data, (size_t)size);
	ret = 0;
out_free:
	free(data);
out_close:
	fclose(f);
	return ret;
}

static int skip_hidden(const struct dirent *e)
{
	return e->d_name[0] != '.';
}

/* Replays the regular files of dir; returns how many, or -1 on an error. */
static int replay_dir(const char *dir)
{
	struct dirent **names;
	int n, count = 0, ret = 0;

	n = scandir(dir, &names, skip_hidden, alphasort);
	if (n < 0) {
		fprintf(stderr, "replay: %s: %s\n", dir, strerror(errno));
		return -1;
	}
	for (int i = 0; i < n; i++) {
		char path[4096];
		struct stat st;

		if (ret == 0) {
			if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, names[i]->d_name) >= sizeof(path)) {
				fprintf(stderr, "replay: %s/%s: path too long\n", dir, names[i]->d_name);
				ret = -1;
			} else if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
				if (replay_file(path))
					ret = -1;
				else
					count++;
			}
		}
		free(names[i]);
	}
	free(names);
	return ret ? ret : count;
}

int main(int argc, char **argv)
{
	int total = 0;

	if (argc < 2) {
		fprintf(stderr, "usage: %s PATH...  (corpus directories or input files)\n", argv[0]);
		return 2;
	}
	for (int i = 1; i < argc; i++) {
		struct stat st;
		int n;

		if (stat(argv[i], &st)) {
			fprintf(stderr, "replay: %s: %s\n", argv[i], strerror(errno));
			return 1;
		}
		n = S_ISDIR(st.st_mode) ? replay_dir(argv[i]) : (replay_file(argv[i]) ? -1 : 1);
		if (n < 0)
			return 1;
		total += n;
	}
	if (total == 0) {
		fprintf(stderr, "replay: no inputs found in the given paths\n");
		return 1;
	}
	printf("replayed %d inputs, all invariants held\n", total);
	return 0;
}
