/* The main() of a cmocka unit test program: one group of tests, run in the order listed, with the
 * group's setup and teardown (NULL for none). Include after cmocka.h. */
#pragma once

/* UNIT_TEST_MAIN(setup, teardown, cmocka_unit_test(test_a), cmocka_unit_test(test_b), ...) defines
 * main(), which returns cmocka_run_group_tests' count of failed tests. */
#define UNIT_TEST_MAIN(group_setup, group_teardown, ...)                                   \
        int main(void)                                                                     \
        {                                                                                  \
                const struct CMUnitTest tests[] = { __VA_ARGS__ };                         \
                return cmocka_run_group_tests(tests, group_setup, group_teardown);         \
        }
