/* Tests of base/metrics.c and transport/metrics_http.c: the exposition text exactly (HELP and TYPE once
 * per name, labels, cumulative buckets, +Inf, NaN), counts that add up exactly from several threads,
 * registration rules, and /metrics served over HTTP (404 elsewhere, a taken port refused). */
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <cmocka.h>

#include "unit.h"

#include "metrics.h"
#include "metrics_http.h"

static int teardown(void **state) {
        (void)state;
        metrics_reset();
        return 0;
}

static void test_exposition(void **state) {
        (void)state;
        struct metric *a0 = metric_counter("t_pushes_total", "Pushes.", "shard", "0");
        struct metric *g = metric_gauge("t_step", "Step.", NULL, NULL);
        struct metric *a1 = metric_counter("t_pushes_total", "Pushes.", "shard", "1");
        static const double b[] = {0.001, 0.01};
        struct metric *h = metric_histogram("t_apply_seconds", "Apply \"time\".", "shard", "0", b, 2);
        struct metric *never = metric_age("t_age_seconds", "Age.", "worker", "a\"b\\c");
        assert_non_null(a0);
        assert_non_null(a1);
        assert_non_null(h);
        metric_add(a0, 3);
        metric_add(a1, 1);
        metric_add(a0, 2);
        metric_set(g, 1.5);
        metric_observe_us(h, 500);      /* 0.0005: first bucket */
        metric_observe_us(h, 10000);    /* 0.01: on the bound, so in it */
        metric_observe(h, 7);           /* +Inf */
        metric_add(NULL, 1);            /* NULL series: nothing, no crash */
        metric_set(NULL, 1);
        metric_observe(NULL, 1);
        metric_touch(NULL);
        size_t len;
        char *text = metrics_render(&len);
        assert_non_null(text);
        assert_int_equal(len, strlen(text));
        const char *want =
                "# HELP t_pushes_total Pushes.\n"
                "# TYPE t_pushes_total counter\n"
                "t_pushes_total{shard=\"0\"} 5\n"
                "t_pushes_total{shard=\"1\"} 1\n"
                "# HELP t_step Step.\n"
                "# TYPE t_step gauge\n"
                "t_step 1.5\n"
                "# HELP t_apply_seconds Apply \"time\".\n"
                "# TYPE t_apply_seconds histogram\n"
                "t_apply_seconds_bucket{shard=\"0\",le=\"0.001\"} 1\n"
                "t_apply_seconds_bucket{shard=\"0\",le=\"0.01\"} 2\n"
                "t_apply_seconds_bucket{shard=\"0\",le=\"+Inf\"} 3\n"
                "t_apply_seconds_sum{shard=\"0\"} 7.0105\n"
                "t_apply_seconds_count{shard=\"0\"} 3\n"
                "# HELP t_age_seconds Age.\n"
                "# TYPE t_age_seconds gauge\n"
                "t_age_seconds{worker=\"a\\\"b\\\\c\"} NaN\n";
        assert_string_equal(text, want);
        free(text);

        metric_touch(never);
        usleep(20000);
        text = metrics_render(&len);
        const char *age = strstr(text, "t_age_seconds{worker=\"a\\\"b\\\\c\"} ");
        assert_non_null(age);
        double v = strtod(strchr(age, '}') + 2, NULL);
        assert_true(v >= 0.019 && v < 5);
        free(text);
}

static void test_registration(void **state) {
        (void)state;
        struct metric *a = metric_counter("t_x_total", "X.", "shard", "0");
        assert_non_null(a);
        assert_ptr_equal(metric_counter("t_x_total", "X.", "shard", "0"), a);   /* the same series again */
        assert_ptr_not_equal(metric_counter("t_x_total", "X.", "shard", "1"), a);
        assert_null(metric_gauge("t_x_total", "X.", "shard", "2"));              /* another type */
        assert_null(metric_counter("t_x_total", "X.", "worker", "0"));           /* another label */
        assert_null(metric_counter("t_x_total", "X.", NULL, NULL));
        /* the table is bounded: a full table refuses, it does not grow or crash */
        struct metric *last = NULL;
        char v[16];
        for (int i = 0; i < 600; i++) {
                snprintf(v, sizeof(v), "%d", i);
                struct metric *m = metric_counter("t_many_total", "Many.", "i", v);
                if (!m)
                        break;
                last = m;
        }
        assert_non_null(last);
        snprintf(v, sizeof(v), "%d", 700);
        assert_null(metric_counter("t_many_total", "Many.", "i", v));
}

static void *adder(void *arg) {
        struct metric **m = arg;
        for (int i = 0; i < 100000; i++) {
                metric_add(m[0], 1);
                metric_observe_us(m[1], 1);
        }
        return NULL;
}

static void test_threads(void **state) {
        (void)state;
        struct metric *m[2] = {
                metric_counter("t_n_total", "N.", NULL, NULL),
                metric_histogram("t_h_seconds", "H.", NULL, NULL, metrics_latency_buckets, metrics_n_latency_buckets),
        };
        pthread_t t[4];
        for (int i = 0; i < 4; i++)
                assert_int_equal(pthread_create(&t[i], NULL, adder, m), 0);
        for (int i = 0; i < 4; i++)
                pthread_join(t[i], NULL);
        size_t len;
        char *text = metrics_render(&len);
        assert_non_null(strstr(text, "\nt_n_total 400000\n"));
        assert_non_null(strstr(text, "\nt_h_seconds_count 400000\n"));
        assert_non_null(strstr(text, "\nt_h_seconds_bucket{le=\"5e-05\"} 400000\n"));
        const char *sum = strstr(text, "\nt_h_seconds_sum ");
        assert_non_null(sum);
        assert_true(fabs(strtod(sum + strlen("\nt_h_seconds_sum "), NULL) - 0.4) < 1e-9);
        free(text);
}

static int free_port(void) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t l = sizeof(a);
        assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
        assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &l), 0);
        close(fd);
        return ntohs(a.sin_port);
}

/* The whole HTTP answer to one request line. */
static char *get(int port, const char *request) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
        assert_true(write(fd, request, strlen(request)) == (ssize_t)strlen(request));
        static char buf[65536];
        size_t n = 0;
        ssize_t r;
        while (n < sizeof(buf) - 1 && (r = read(fd, buf + n, sizeof(buf) - 1 - n)) > 0)
                n += (size_t)r;
        buf[n] = 0;
        close(fd);
        return buf;
}

static void test_http(void **state) {
        (void)state;
        metric_add(metric_counter("t_served_total", "Served.", NULL, NULL), 42);
        char addr[64], err[256];
        int port = free_port();
        snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
        struct metrics_http *h = NULL;
        assert_int_equal(metrics_http_start(addr, NULL, &h, err, sizeof(err)), 0);
        char *r = get(port, "GET /metrics HTTP/1.0\r\n\r\n");
        assert_non_null(strstr(r, "HTTP/1.0 200") ? r : strstr(r, "HTTP/1.1 200"));
        assert_non_null(strstr(r, "text/plain; version=0.0.4"));
        assert_non_null(strstr(r, "\r\n\r\n# HELP t_served_total Served.\n# TYPE t_served_total counter\nt_served_total 42\n"));
        r = get(port, "GET / HTTP/1.0\r\n\r\n");
        assert_non_null(strstr(r, " 404 "));
        r = get(port, "POST /metrics HTTP/1.0\r\nContent-Length: 0\r\n\r\n");
        assert_non_null(strstr(r, " 405 "));

        /* the same port again: taken, said so */
        struct metrics_http *h2 = NULL;
        assert_int_equal(metrics_http_start(addr, NULL, &h2, err, sizeof(err)), -EADDRINUSE);
        assert_non_null(strstr(err, addr));
        assert_null(h2);
        assert_null(metrics_http_free(h));
        assert_null(metrics_http_free(NULL));

        assert_int_equal(metrics_http_check("127.0.0.1:0", err, sizeof(err)), -EINVAL);
        assert_int_equal(metrics_http_check("9400", err, sizeof(err)), -EINVAL);
        assert_int_equal(metrics_http_check("[::1]:9400", err, sizeof(err)), 0);
        assert_int_equal(metrics_http_check("localhost:9400", err, sizeof(err)), 0);
}

UNIT_TEST_MAIN(NULL, NULL,
        cmocka_unit_test_teardown(test_exposition, teardown),
        cmocka_unit_test_teardown(test_registration, teardown),
        cmocka_unit_test_teardown(test_threads, teardown),
        cmocka_unit_test_teardown(test_http, teardown))
