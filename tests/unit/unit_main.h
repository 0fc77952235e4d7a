/*
 * The main() of every unit test program: with no argument it runs every case; with a case name
 * (how ctest runs it, one ctest test per case) it runs that case only, and fails if no case has
 * that name, so a renamed case never passes by running nothing.
 */
#ifndef MESH_TESTS_UNIT_MAIN_H
#define MESH_TESTS_UNIT_MAIN_H

#include <stdio.h>
#include <string.h>

#define UNIT_MAIN(group, tests, setup, teardown)                                              \
	int main(int argc, char **argv)                                                         \
	{                                                                                       \
		if (argc > 1) {                                                                 \
			size_t i_;                                                              \
			for (i_ = 0; i_ < sizeof(tests) / sizeof((tests)[0]); i_++)             \
				if (!strcmp((tests)[i_].name, argv[1]))                         \
					break;                                                  \
			if (i_ == sizeof(tests) / sizeof((tests)[0])) {                         \
				fprintf(stderr, "%s: no test case named %s\n", argv[0], argv[1]); \
				return 2;                                                       \
			}                                                                       \
			cmocka_set_test_filter(argv[1]);                                        \
		}                                                                               \
		return cmocka_run_group_tests_name(group, tests, setup, teardown);              \
	}

#endif
