/* Thin wrappers over sd_notify(3); no-ops without NOTIFY_SOCKET. */
#include "notify.h"

#include <stdarg.h>
#include <stdio.h>
#include <systemd/sd-daemon.h>

int notify_ready(void) {
        return sd_notify(0, "READY=1");
}

int notify_status(const char *fmt, ...) {
        char buf[1024];
        va_list ap;
        int n;

        n = snprintf(buf, sizeof(buf), "STATUS=");
        va_start(ap, fmt);
        vsnprintf(buf + n, sizeof(buf) - (size_t) n, fmt, ap);
        va_end(ap);
        return sd_notify(0, buf);
}

int notify_stopping(void) {
        return sd_notify(0, "STOPPING=1");
}

int notify_watchdog(void) {
        return sd_notify(0, "WATCHDOG=1");
}

uint64_t notify_watchdog_usec(void) {
        uint64_t usec = 0;

        if (sd_watchdog_enabled(0, &usec) <= 0)
                return 0;
        return usec;
}
