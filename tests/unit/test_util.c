/* Tests of util.c: strict number parsing, strings, directories and durable file writes (atomic_file). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "scratch_dir.h"
#include "unit.h"

#include "util.h"

static int setup(void **state) {
        return scratch_dir_make("util");
}

static void test_clocks(void **state) {
        uint64_t a = mono_us(), b, t = now_us();

        assert_true(t > UINT64_C(1600000000) * 1000000); /* after 2020 */
        usleep(2000);
        b = mono_us();
        assert_true(b >= a + 2000);
        for (uint64_t ms = 0; ms < 3000; ms += 999) {   /* the nanoseconds carry into seconds */
                uint64_t before = now_us();
                struct timespec ts = realtime_in_ms(ms);
                uint64_t at = (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
                assert_true(ts.tv_nsec >= 0 && ts.tv_nsec < 1000000000L);
                assert_true(at >= before + ms * 1000 && at <= now_us() + ms * 1000);
        }
}

static void test_parse_u64(void **state) {
        uint64_t v = 7;

        assert_int_equal(parse_u64("0", 0, 10, &v), 0);
        assert_int_equal(v, 0);
        assert_int_equal(parse_u64("18446744073709551615", 0, UINT64_MAX, &v), 0);
        assert_true(v == UINT64_MAX);
        assert_int_equal(parse_u64("007", 0, 10, &v), 0);
        assert_int_equal(v, 7);

        v = 99;
        assert_int_equal(parse_u64("18446744073709551616", 0, UINT64_MAX, &v), -ERANGE);
        assert_int_equal(parse_u64("11", 0, 10, &v), -ERANGE);
        assert_int_equal(parse_u64("0", 1, 10, &v), -ERANGE);
        assert_int_equal(parse_u64("", 0, 10, &v), -EINVAL);
        assert_int_equal(parse_u64(NULL, 0, 10, &v), -EINVAL);
        assert_int_equal(parse_u64("1x", 0, 10, &v), -EINVAL);
        assert_int_equal(parse_u64(" 1", 0, 10, &v), -EINVAL);
        assert_int_equal(parse_u64("1 ", 0, 10, &v), -EINVAL);
        assert_int_equal(parse_u64("-1", 0, 10, &v), -EINVAL);
        assert_int_equal(parse_u64("+1", 0, 10, &v), -EINVAL);
        assert_int_equal(parse_u64("0x1", 0, 10, &v), -EINVAL);
        assert_int_equal(v, 99); /* untouched on failure */
}

static void test_strdup_printf(void **state) {
        char *s = strdup_printf("%s:%d", "host", 7000);

        assert_string_equal(s, "host:7000");
        free(s);
        s = strdup_printf("%s", "");
        assert_string_equal(s, "");
        free(s);
}

static void test_mkdir_p(void **state) {
        char *p = strdup_printf("%s/a/b//c", scratch_dir), *f;
        struct stat st;

        assert_int_equal(mkdir_p(p, 0755), 0);
        assert_int_equal(stat(p, &st), 0);
        assert_true(S_ISDIR(st.st_mode));
        assert_int_equal(mkdir_p(p, 0755), 0); /* exists: fine */
        f = strdup_printf("%s/file", scratch_dir);
        assert_int_equal(write_file_atomic(f, "x", 1), 0);
        free(p);
        p = strdup_printf("%s/file/sub", scratch_dir);
        assert_int_equal(mkdir_p(p, 0755), -ENOTDIR);
        assert_int_equal(mkdir_p(f, 0755), -ENOTDIR);
        assert_int_equal(mkdir_p("", 0755), -EINVAL);
        free(p);
        free(f);
}

static void test_files(void **state) {
        char *p = strdup_printf("%s/data.bin", scratch_dir), *data = NULL;
        char big[100000];
        size_t len = 0;
        DIR *d;
        struct dirent *de;
        struct stat st;

        assert_int_equal(write_file_atomic(p, "hello", 5), 0);
        assert_int_equal(read_file(p, 100, &data, &len), 0);
        assert_int_equal(len, 5);
        assert_string_equal(data, "hello");
        free(data);

        /* Replacing keeps no temp files around. */
        for (size_t i = 0; i < sizeof(big); i++)
                big[i] = (char) (i * 7);
        assert_int_equal(write_file_atomic(p, big, sizeof(big)), 0);
        assert_int_equal(read_file(p, sizeof(big), &data, &len), 0);
        assert_int_equal(len, sizeof(big));
        assert_memory_equal(data, big, sizeof(big));
        free(data);
        assert_int_equal(stat(p, &st), 0);
        assert_int_equal(st.st_mode & 0044, 0044 & ~0); /* readable by others unless umask says no */
        d = opendir(scratch_dir);
        while ((de = readdir(d)))
                assert_null(strstr(de->d_name, ".tmp"));
        closedir(d);

        data = NULL;
        assert_int_equal(read_file(p, sizeof(big) - 1, &data, &len), -EFBIG);
        assert_null(data);

        assert_int_equal(write_file_atomic(p, "", 0), 0);
        assert_int_equal(read_file(p, 0, &data, NULL), 0);
        assert_string_equal(data, "");
        free(data);
        data = NULL;

        free(p);
        p = strdup_printf("%s/missing/x", scratch_dir);
        assert_int_equal(read_file(p, 100, &data, &len), -ENOENT);
        assert_int_equal(write_file_atomic(p, "x", 1), -ENOENT);
        assert_null(data);
        free(p);
}

static void test_backoff(void **state) {
        struct backoff b;
        backoff_init(&b, 100, 2000);
        uint64_t want[] = {100, 200, 400, 800, 1600, 2000, 2000};
        for (size_t i = 0; i < ELEMENTSOF(want); i++)
                assert_int_equal(backoff_next(&b), want[i]);
        backoff_reset(&b);
        assert_int_equal(backoff_next(&b), 100);
        backoff_init(&b, 0, 0);   /* a zero first wait would never grow: it is 1 */
        assert_int_equal(backoff_next(&b), 1);
        assert_int_equal(backoff_next(&b), 1);
        backoff_init(&b, 3, UINT64_MAX);   /* doubling never overflows */
        for (int i = 0; i < 70; i++)
                backoff_next(&b);
        assert_true(backoff_next(&b) >= (UINT64_MAX >> 2));
}

/* Reads path whole into a static buffer (NUL-terminated); "" when it cannot. */
static const char *content(const char *path) {
        static char buf[256];
        char *data = NULL;
        buf[0] = 0;
        if (read_file(path, sizeof(buf) - 1, &data, NULL) == 0)
                snprintf(buf, sizeof(buf), "%s", data);
        free(data);
        return buf;
}

static void test_atomic_file(void **state) {
        char *p = strdup_printf("%s/af.txt", scratch_dir), *named = strdup_printf("%s/.af.txt.tmp", scratch_dir);
        struct atomic_file *af = NULL;
        struct stat st;
        bool renamed = false;
        mode_t um = umask(022);

        /* A stream of writes appears at once, at the commit; the old content stays until then. */
        assert_int_equal(write_file_atomic(p, "old", 3), 0);
        assert_int_equal(atomic_file_open(p, NULL, 0644, &af), 0);
        assert_non_null(af);
        const char *tmp = atomic_file_temp_path(af);
        assert_int_equal(strncmp(tmp, p, strlen(p)), 0);
        assert_int_equal(strncmp(tmp + strlen(p), ".tmp", 4), 0);
        assert_int_equal(atomic_file_write(af, "new ", 4), 0);
        assert_int_equal(atomic_file_write(af, "", 0), 0);
        assert_int_equal(atomic_file_write(af, "content", 7), 0);
        assert_string_equal(content(p), "old");
        char *tmp_copy = strdup(tmp);
        assert_int_equal(access(tmp_copy, F_OK), 0);
        assert_int_equal(atomic_file_commit(af, &renamed), 0);
        assert_true(renamed);
        assert_string_equal(content(p), "new content");
        assert_int_equal(access(tmp_copy, F_OK), -1);
        free(tmp_copy);

        /* A named temp file: after the sync it holds everything, and path still the old content. A
         * leftover of that name (from a crash) is truncated and gets the mode asked for. */
        FILE *f = fopen(named, "w");
        assert_non_null(f);
        fputs("leftover from a crash, longer than what follows", f);
        fclose(f);
        assert_int_equal(chmod(named, 0600), 0);
        assert_int_equal(atomic_file_open(p, named, 0644, &af), 0);
        assert_string_equal(atomic_file_temp_path(af), named);
        assert_int_equal(atomic_file_write(af, "third", 5), 0);
        assert_int_equal(atomic_file_sync(af), 0);
        assert_string_equal(content(named), "third");
        assert_string_equal(content(p), "new content");
        assert_int_equal(atomic_file_write(af, "x", 1), -EBADF);   /* synced: closed for writing */
        assert_int_equal(atomic_file_sync(af), 0);                 /* twice is harmless */
        assert_int_equal(atomic_file_commit(af, NULL), 0);
        assert_string_equal(content(p), "third");
        assert_int_equal(access(named, F_OK), -1);
        assert_int_equal(stat(p, &st), 0);
        assert_int_equal(st.st_mode & 0777, 0644);

        /* Abort: path untouched, no temp file left; NULL-safe. */
        assert_int_equal(atomic_file_open(p, named, 0600, &af), 0);
        assert_int_equal(atomic_file_write(af, "never", 5), 0);
        assert_null(atomic_file_abort(af));
        assert_null(atomic_file_abort(NULL));
        assert_string_equal(content(p), "third");
        assert_int_equal(access(named, F_OK), -1);

        /* Errors: nothing created, *ret untouched. */
        char *missing = strdup_printf("%s/missing/x", scratch_dir);
        af = NULL;
        assert_int_equal(atomic_file_open(missing, NULL, 0644, &af), -ENOENT);
        assert_int_equal(atomic_file_open("", NULL, 0644, &af), -EINVAL);
        assert_int_equal(atomic_file_open(p, "", 0644, &af), -EINVAL);
        assert_null(af);
        free(missing);

        /* A rename that fails (path is a directory that is not empty): the temp file goes, path stays. */
        char *dir = strdup_printf("%s/adir", scratch_dir), *inside = strdup_printf("%s/adir/f", scratch_dir);
        assert_int_equal(mkdir_p(dir, 0755), 0);
        assert_int_equal(write_file_atomic(inside, "kept", 4), 0);
        assert_int_equal(atomic_file_open(dir, named, 0644, &af), 0);
        assert_int_equal(atomic_file_write(af, "y", 1), 0);
        renamed = true;
        assert_true(atomic_file_commit(af, &renamed) < 0);
        assert_false(renamed);
        assert_int_equal(access(named, F_OK), -1);
        assert_string_equal(content(inside), "kept");
        free(dir);
        free(inside);

        umask(um);
        free(named);
        free(p);
}

static void test_grow_array(void **state) {
        int *a = NULL;
        size_t cap = 0;
        assert_int_equal(grow_array((void **)&a, &cap, 1, sizeof(*a), 4), 0);
        assert_int_equal(cap, 4);
        for (int i = 0; i < 4; i++)
                a[i] = i;
        assert_int_equal(grow_array((void **)&a, &cap, 4, sizeof(*a), 4), 0);   /* room already */
        assert_int_equal(cap, 4);
        assert_int_equal(grow_array((void **)&a, &cap, 9, sizeof(*a), 4), 0);   /* doubles until it fits */
        assert_int_equal(cap, 16);
        for (int i = 0; i < 4; i++)
                assert_int_equal(a[i], i);                                       /* contents kept */
        int *before = a;
        assert_int_equal(grow_array((void **)&a, &cap, SIZE_MAX / 2, sizeof(*a), 4), -ENOMEM);
        assert_ptr_equal(a, before);                                             /* unchanged on failure */
        assert_int_equal(cap, 16);
        free(a);
}

static void test_split_host_port(void **state) {
        (void)state;
        char host[16];
        const char *port;
        assert_int_equal(split_host_port("127.0.0.1:9400", host, sizeof(host), &port), 0);
        assert_string_equal(host, "127.0.0.1");
        assert_string_equal(port, "9400");
        assert_int_equal(split_host_port("[::1]:80", host, sizeof(host), &port), 0);
        assert_string_equal(host, "::1");
        assert_string_equal(port, "80");
        assert_int_equal(split_host_port(":80", host, sizeof(host), &port), 0);
        assert_string_equal(host, "");
        assert_int_equal(split_host_port("9400", host, sizeof(host), &port), -EINVAL);
        assert_int_equal(split_host_port("a-host-name-too-long:1", host, sizeof(host), &port), -EINVAL);
        assert_int_equal(split_host_port("a-host-name-ok-:1", host, sizeof(host), &port), 0);   /* 15 + NUL */
        assert_string_equal(host, "a-host-name-ok-");
}

/* u64_find_repeat: the value given twice, at any alignment, the input left as it was. */
static void test_u64_find_repeat(void **state) {
        (void)state;
        uint64_t v[] = {9, UINT64_MAX, 3, 0, 77}, dup = 1;
        assert_int_equal(u64_find_repeat(v, 5, &dup), 0);
        assert_int_equal(u64_find_repeat(v, 0, &dup), 0);
        assert_int_equal(dup, 1);
        v[4] = UINT64_MAX;
        assert_int_equal(u64_find_repeat(v, 5, &dup), 1);
        assert_true(dup == UINT64_MAX);
        assert_true(v[0] == 9 && v[1] == UINT64_MAX && v[2] == 3 && v[4] == UINT64_MAX);   /* not sorted in place */
        unsigned char raw[1 + 3 * sizeof(uint64_t)];   /* unaligned, as a file's tensor may be */
        uint64_t w[3] = {5, 6, 5};
        memcpy(raw + 1, w, sizeof(w));
        assert_int_equal(u64_find_repeat(raw + 1, 3, &dup), 1);
        assert_true(dup == 5);
}

UNIT_TEST_MAIN(setup, scratch_dir_remove,
        cmocka_unit_test(test_clocks),
        cmocka_unit_test(test_parse_u64),
        cmocka_unit_test(test_u64_find_repeat),
        cmocka_unit_test(test_strdup_printf),
        cmocka_unit_test(test_mkdir_p),
        cmocka_unit_test(test_files),
        cmocka_unit_test(test_backoff),
        cmocka_unit_test(test_grow_array),
        cmocka_unit_test(test_atomic_file),
        cmocka_unit_test(test_split_host_port))
