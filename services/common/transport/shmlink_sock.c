/* The attach socket of the shared-memory link (shmlink.h, "Attaching takes two steps"): psd's listener,
 * which takes a worker's segment descriptor over a unix socket and holds it for the worker's
 * AttachSharedMemory call, and the worker's side, which sends it.
 *
 * One message each way on a SOCK_SEQPACKET connection: the worker's hello (magic and nonce, the
 * descriptor as SCM_RIGHTS), psd's answer (status and message). The listener's thread serves every
 * connection with a deadline, so a client that connects and says nothing holds nothing for long. */
#include "shmlink.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "log.h"
#include "util.h"

#define HELLO_MAGIC "PSFLATT1"
#define MAX_CONNS 16         /* connections served at once; more are refused until one ends */
#define CONN_MS 2000         /* a connection must say its piece within this */
#define MAX_FDS 8            /* descriptors read from one message (all but one are refused) */

struct hello {
        char magic[8];
        uint8_t nonce[SHMLINK_NONCE];
};

struct answer {
        int32_t status;      /* 0 or -errno */
        char msg[SHMLINK_MSG];
};

struct pending {
        int fd;
        pid_t pid;
        uid_t uid;
        uint8_t nonce[SHMLINK_NONCE];
        uint64_t until_us;   /* monotonic */
};

struct conn {
        int fd;
        struct ucred cred;
        uint64_t until_us;
};

struct shmlink_server {
        char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
        int lfd, wake;
        dev_t dev;           /* of our socket file: removed at the end only if it is still ours */
        ino_t ino;
        shmlink_refused_fn refused;
        void *ud;
        pthread_t thread;
        bool started;
        pthread_mutex_t mu;  /* the pending descriptors */
        struct pending pend[SHMLINK_PENDING_MAX];
        uint32_t n_pend;
        struct conn conns[MAX_CONNS];   /* the thread's own */
        uint32_t n_conns;
};

int shmlink_socket_path(const char *runtime_dir, const char *job, uint32_t shard, char *buf, size_t len, char *err,
                        size_t errlen) {
        size_t max = sizeof(((struct sockaddr_un *)0)->sun_path);
        int n = snprintf(buf, len, "%s/%s-ps-%u.sock", runtime_dir, job, shard);
        if (n < 0 || (size_t)n >= len || (size_t)n >= max)
                return errf(err, errlen, -ENAMETOOLONG, "the socket path \"%s/%s-ps-%u.sock\" is longer than a unix "
                            "socket's %zu bytes (rpc.runtime_dir)", runtime_dir, job, shard, max - 1);
        return 0;
}

static int address(const char *path, struct sockaddr_un *a) {
        memset(a, 0, sizeof(*a));
        a->sun_family = AF_UNIX;
        if (strlen(path) >= sizeof(a->sun_path))
                return -ENAMETOOLONG;
        memcpy(a->sun_path, path, strlen(path));
        return 0;
}

/* Waits until fd has `events` or the deadline (monotonic µs) passes: 1, 0 on timeout, or -errno. */
static int wait_fd(int fd, short events, uint64_t until_us) {
        for (;;) {
                uint64_t now = mono_us();
                if (now >= until_us)
                        return 0;
                struct pollfd p = {.fd = fd, .events = events};
                int n = poll(&p, 1, (int)((until_us - now + 999) / 1000));
                if (n > 0)
                        return 1;
                if (n < 0 && errno != EINTR)
                        return -errno;
        }
}

/* ---- the worker's side ---- */

/* Connects without blocking on a full backlog (a busy listener), until the deadline. */
static int connect_until(int s, const struct sockaddr_un *a, uint64_t until_us) {
        for (;;) {
                if (connect(s, (const struct sockaddr *)a, sizeof(*a)) == 0)
                        return 0;
                if (errno != EAGAIN && errno != EINTR)
                        return -errno;
                if (mono_us() >= until_us)
                        return -ETIMEDOUT;
                usleep(10000);
        }
}

int shmlink_send(const char *path, int fd, const uint8_t nonce[SHMLINK_NONCE], uint64_t timeout_ms, char *err,
                 size_t errlen) {
        struct sockaddr_un a;
        if (address(path, &a) < 0)
                return errf(err, errlen, -ENAMETOOLONG, "\"%s\" is too long for a unix socket", path);
        uint64_t until = mono_us() + timeout_ms * 1000;
        int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (s < 0)
                return errf(err, errlen, -errno, "socket: %s", strerror(errno));
        int r = connect_until(s, &a, until);
        if (r < 0) {
                close(s);
                return errf(err, errlen, r, "nothing listens at %s: %s", path, strerror(-r));
        }
        struct hello h;
        memcpy(h.magic, HELLO_MAGIC, sizeof(h.magic));
        memcpy(h.nonce, nonce, SHMLINK_NONCE);
        struct iovec iov = {.iov_base = &h, .iov_len = sizeof(h)};
        union {
                struct cmsghdr c;
                char buf[CMSG_SPACE(sizeof(int))];
        } cm;
        memset(&cm, 0, sizeof(cm));
        struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
        if (fd >= 0) {
                m.msg_control = cm.buf;
                m.msg_controllen = sizeof(cm.buf);
                struct cmsghdr *c = CMSG_FIRSTHDR(&m);
                c->cmsg_level = SOL_SOCKET;
                c->cmsg_type = SCM_RIGHTS;
                c->cmsg_len = CMSG_LEN(sizeof(int));
                memcpy(CMSG_DATA(c), &fd, sizeof(int));
        }
        int sent = 0;
        while ((r = wait_fd(s, POLLOUT, until)) > 0) {
                if (sendmsg(s, &m, MSG_NOSIGNAL) >= 0)
                        break;
                if (errno != EAGAIN && errno != EINTR) {
                        sent = -errno;   /* psd may have answered and closed already: read its answer */
                        break;
                }
        }
        if (r <= 0) {
                close(s);
                r = r < 0 ? r : -ETIMEDOUT;
                return errf(err, errlen, r, "%s: cannot send within %llu ms: %s", path, (unsigned long long)timeout_ms,
                            strerror(-r));
        }
        struct answer ans;
        ssize_t n = 0;
        while ((r = wait_fd(s, POLLIN, until)) > 0 && (n = recv(s, &ans, sizeof(ans), 0)) < 0 &&
               (errno == EAGAIN || errno == EINTR))
                ;
        int me = errno;
        close(s);
        if (r <= 0) {
                r = r < 0 ? r : -ETIMEDOUT;
                return errf(err, errlen, r, "%s: no answer within %llu ms", path, (unsigned long long)timeout_ms);
        }
        if (n < 0)
                return errf(err, errlen, -me, "%s: %s", path, strerror(me));
        if ((size_t)n < sizeof(ans.status) + 1)
                return errf(err, errlen, sent ? sent : -ECONNRESET, "%s: closed without an answer%s%s", path,
                            sent ? ": " : "", sent ? strerror(-sent) : "");
        ans.msg[sizeof(ans.msg) - 1] = 0;
        if ((size_t)n < sizeof(ans))
                ans.msg[n - sizeof(ans.status) - 1] = 0;
        if (ans.status > 0 || ans.status < -4095)
                return errf(err, errlen, -EPROTO, "%s: a malformed answer", path);
        if (ans.status < 0)
                return errf(err, errlen, ans.status, "%s: %s", path, ans.msg);
        return 0;
}

/* ---- psd's side ---- */

/* Answers and closes a connection. */
static void answer_close(int fd, int status, const char *msg) {
        struct answer a = {.status = status};
        snprintf(a.msg, sizeof(a.msg), "%s", msg);
        if (send(fd, &a, sizeof(a.status) + strlen(a.msg) + 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0)
                log_debug_errno(errno, "cannot answer on the attach socket");
        close(fd);
}

/* Refuses an attempt: answers status and why, and tells the owner. */
static void refuse(struct shmlink_server *s, int fd, const struct ucred *cr, int status, const char *fmt, ...)
        __attribute__((format(printf, 5, 6)));
static void refuse(struct shmlink_server *s, int fd, const struct ucred *cr, int status, const char *fmt, ...) {
        char why[SHMLINK_MSG - 100], line[SHMLINK_MSG + 200];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, sizeof(why), fmt, ap);
        va_end(ap);
        snprintf(line, sizeof(line), "shared-memory attach on %s from pid %d (uid %u) refused: %s", s->path,
                 (int)cr->pid, (unsigned)cr->uid, why);
        if (s->refused)
                s->refused(s->ud, line);   /* first: counted by the time the sender reads the answer */
        answer_close(fd, status, why);
}

/* Under mu: closes the descriptors whose AttachSharedMemory call did not come in time. */
static void expire(struct shmlink_server *s, uint64_t now) {
        for (uint32_t i = 0; i < s->n_pend;) {
                if (s->pend[i].until_us > now) {
                        i++;
                        continue;
                }
                log_info("dropped the shared memory of pid %d: no AttachSharedMemory call within %d ms",
                         (int)s->pend[i].pid, SHMLINK_PENDING_MS);
                close(s->pend[i].fd);
                s->pend[i] = s->pend[--s->n_pend];
        }
}

/* Holds fd for the sender's AttachSharedMemory call (one per process: a newer replaces an older).
 * 0, or -EBUSY when SHMLINK_PENDING_MAX are held. */
static int hold(struct shmlink_server *s, int fd, const struct ucred *cr, const uint8_t *nonce) {
        pthread_mutex_lock(&s->mu);
        uint64_t now = mono_us();
        expire(s, now);
        uint32_t i = 0;
        while (i < s->n_pend && s->pend[i].pid != cr->pid)
                i++;
        int r = 0;
        if (i < s->n_pend) {
                close(s->pend[i].fd);
        } else if (s->n_pend == SHMLINK_PENDING_MAX) {
                r = -EBUSY;
        } else {
                s->n_pend++;
        }
        if (r == 0) {
                s->pend[i] = (struct pending){.fd = fd, .pid = cr->pid, .uid = cr->uid,
                                              .until_us = now + SHMLINK_PENDING_MS * 1000ull};
                memcpy(s->pend[i].nonce, nonce, SHMLINK_NONCE);
        }
        pthread_mutex_unlock(&s->mu);
        return r;
}

/* Reads a connection's hello and holds its descriptor, or refuses it. False while nothing came yet. */
static bool serve_conn(struct shmlink_server *s, struct conn *c) {
        struct hello h;
        char extra;   /* a longer message shows as more bytes read than a hello */
        struct iovec iov[2] = {{.iov_base = &h, .iov_len = sizeof(h)}, {.iov_base = &extra, .iov_len = 1}};
        union {
                struct cmsghdr c;
                char buf[CMSG_SPACE(MAX_FDS * sizeof(int))];
        } cm;
        struct msghdr m = {.msg_iov = iov, .msg_iovlen = 2, .msg_control = cm.buf, .msg_controllen = sizeof(cm.buf)};
        ssize_t n = recvmsg(c->fd, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
                return false;
        int fds[MAX_FDS], nfd = 0;
        for (struct cmsghdr *cc = n >= 0 ? CMSG_FIRSTHDR(&m) : NULL; cc; cc = CMSG_NXTHDR(&m, cc)) {
                if (cc->cmsg_level != SOL_SOCKET || cc->cmsg_type != SCM_RIGHTS)
                        continue;
                size_t k = (cc->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                for (size_t j = 0; j < k && nfd < MAX_FDS; j++)
                        memcpy(&fds[nfd++], CMSG_DATA(cc) + j * sizeof(int), sizeof(int));
        }
        if (n == 0 && nfd == 0) {
                close(c->fd);   /* connected and left: a psd checking whether we are alive */
                return true;
        }
        /* refused only now, with its message read: closing on an unread message would reset the
         * connection before the sender could read why */
        if (c->cred.uid != geteuid() && c->cred.uid != 0)
                refuse(s, c->fd, &c->cred, -EACCES, "uid %u is neither psd's (%u) nor root", (unsigned)c->cred.uid,
                       (unsigned)geteuid());
        else if (n < 0)
                refuse(s, c->fd, &c->cred, -EPROTO, "cannot read the message: %s", strerror(errno));
        else if ((size_t)n != sizeof(h) || memcmp(h.magic, HELLO_MAGIC, sizeof(h.magic)) != 0)
                refuse(s, c->fd, &c->cred, -EPROTO, "not an attach message (%zd bytes)", n);
        else if (m.msg_flags & MSG_CTRUNC || nfd > 1)
                refuse(s, c->fd, &c->cred, -EPROTO, "more than one descriptor sent");
        else if (nfd == 0)
                refuse(s, c->fd, &c->cred, -EPROTO, "no descriptor sent");
        else if (hold(s, fds[0], &c->cred, h.nonce) < 0)
                refuse(s, c->fd, &c->cred, -EBUSY, "%d attaches pending already", SHMLINK_PENDING_MAX);
        else {
                char ok[80];
                snprintf(ok, sizeof(ok), "held for %d ms", SHMLINK_PENDING_MS);
                answer_close(c->fd, 0, ok);
                log_debug("holding the shared memory of pid %d for its AttachSharedMemory call", (int)c->cred.pid);
                return true;
        }
        for (int i = 0; i < nfd; i++)
                close(fds[i]);
        return true;
}

/* A new connection; its credentials are those of its connect() (only psd's own user, or root, may
 * attach: serve_conn). */
static void accept_conn(struct shmlink_server *s) {
        int fd = accept4(s->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0)
                return;
        struct conn c = {.fd = fd, .until_us = mono_us() + CONN_MS * 1000ull};
        socklen_t len = sizeof(c.cred);
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &c.cred, &len) < 0) {
                c.cred = (struct ucred){.pid = 0, .uid = (uid_t)-1, .gid = (gid_t)-1};
                refuse(s, fd, &c.cred, -EACCES, "cannot read the peer's credentials: %s", strerror(errno));
                return;
        }
        if (s->n_conns == MAX_CONNS) {
                refuse(s, fd, &c.cred, -EBUSY, "%d connections at once already", MAX_CONNS);
                return;
        }
        s->conns[s->n_conns++] = c;
}

static void *server_main(void *arg) {
        struct shmlink_server *s = arg;
        for (;;) {
                struct pollfd p[2 + MAX_CONNS] = {{.fd = s->wake, .events = POLLIN}, {.fd = s->lfd, .events = POLLIN}};
                uint64_t now = mono_us(), next = now + 1000000;   /* at least once a second: expire */
                for (uint32_t i = 0; i < s->n_conns; i++) {
                        p[2 + i] = (struct pollfd){.fd = s->conns[i].fd, .events = POLLIN};
                        next = s->conns[i].until_us < next ? s->conns[i].until_us : next;
                }
                int n = poll(p, 2 + s->n_conns, next > now ? (int)((next - now + 999) / 1000) : 0);
                if (n < 0 && errno != EINTR) {
                        log_warning_errno(errno, "attach socket %s: poll", s->path);
                        usleep(100000);
                }
                if (p[0].revents & POLLIN)
                        return NULL;
                now = mono_us();
                /* the connections polled, back to front: a finished one is replaced by the last */
                for (uint32_t i = s->n_conns; i-- > 0;) {
                        struct conn *c = &s->conns[i];
                        bool done;
                        if (p[2 + i].revents)
                                done = serve_conn(s, c);
                        else if ((done = now >= c->until_us))
                                refuse(s, c->fd, &c->cred, -ETIMEDOUT, "no message within %d ms", CONN_MS);
                        if (done)
                                *c = s->conns[--s->n_conns];
                }
                if (p[1].revents & POLLIN)
                        accept_conn(s);
                pthread_mutex_lock(&s->mu);
                expire(s, now);
                pthread_mutex_unlock(&s->mu);
        }
}

/* Whether a listener accepts at path (a psd of this name is running). */
static bool alive(const struct sockaddr_un *a) {
        int t = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (t < 0)
                return false;
        bool yes = connect(t, (const struct sockaddr *)a, sizeof(*a)) == 0 || errno == EAGAIN;
        close(t);
        return yes;
}

/* The directory (made 0750 when missing), and the way cleared of a stale socket. */
static int prepare(const char *path, const struct sockaddr_un *a, char *err, size_t errlen) {
        char dir[sizeof(a->sun_path)];
        snprintf(dir, sizeof(dir), "%s", path);
        char *slash = strrchr(dir, '/');
        if (slash && slash != dir) {
                *slash = 0;
                int r = mkdir_p(dir, 0750);
                if (r < 0)
                        return errf(err, errlen, r, "cannot make the directory %s: %s", dir, strerror(-r));
        }
        struct stat st;
        if (lstat(path, &st) < 0)
                return errno == ENOENT ? 0 : errf(err, errlen, -errno, "%s: %s", path, strerror(errno));
        if (!S_ISSOCK(st.st_mode))
                return errf(err, errlen, -EEXIST, "%s is in the way: not a socket", path);
        if (alive(a))
                return errf(err, errlen, -EADDRINUSE, "another psd listens at %s already", path);
        if (unlink(path) < 0 && errno != ENOENT)
                return errf(err, errlen, -errno, "cannot remove the stale socket %s: %s", path, strerror(errno));
        log_info("replaced the stale socket %s (of a psd that is gone)", path);
        return 0;
}

int shmlink_server_new(const char *path, shmlink_refused_fn refused, void *ud, struct shmlink_server **ret, char *err,
                       size_t errlen) {
        struct sockaddr_un a;
        if (address(path, &a) < 0)
                return errf(err, errlen, -ENAMETOOLONG, "\"%s\" is too long for a unix socket", path);
        int r = prepare(path, &a, err, errlen);
        if (r < 0)
                return r;
        struct shmlink_server *s = calloc(1, sizeof(*s));
        if (!s)
                return errf(err, errlen, -ENOMEM, "out of memory");
        snprintf(s->path, sizeof(s->path), "%s", path);
        s->refused = refused;
        s->ud = ud;
        s->wake = -1;
        pthread_mutex_init(&s->mu, NULL);
        struct stat st;
        if ((s->lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0)) < 0) {
                r = errf(err, errlen, -errno, "socket: %s", strerror(errno));
        } else if (bind(s->lfd, (const struct sockaddr *)&a, sizeof(a)) < 0) {
                r = errf(err, errlen, -errno, "cannot make the socket %s: %s", path, strerror(errno));
        } else if (chmod(path, 0660) < 0 || lstat(path, &st) < 0 || listen(s->lfd, MAX_CONNS) < 0) {
                r = errf(err, errlen, -errno, "cannot set up the socket %s: %s", path, strerror(errno));
                unlink(path);
        } else if ((s->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0) {
                r = errf(err, errlen, -errno, "eventfd: %s", strerror(errno));
                unlink(path);
        } else if ((r = -pthread_create(&s->thread, NULL, server_main, s)) < 0) {
                errf(err, errlen, r, "cannot start a thread: %s", strerror(-r));
                unlink(path);
        }
        if (r < 0) {
                if (s->lfd >= 0)
                        close(s->lfd);
                if (s->wake >= 0)
                        close(s->wake);
                pthread_mutex_destroy(&s->mu);
                free(s);
                return r;
        }
        s->dev = st.st_dev;
        s->ino = st.st_ino;
        s->started = true;
        *ret = s;
        return 0;
}

int shmlink_server_take(struct shmlink_server *s, const uint8_t nonce[SHMLINK_NONCE], int *fd_ret, pid_t *pid_ret,
                        uid_t *uid_ret, char *err, size_t errlen) {
        pthread_mutex_lock(&s->mu);
        expire(s, mono_us());
        uint32_t i = 0;
        while (i < s->n_pend && memcmp(s->pend[i].nonce, nonce, SHMLINK_NONCE) != 0)
                i++;
        int r = 0;
        if (i == s->n_pend) {
                r = errf(err, errlen, -ENOENT, "no descriptor with this nonce came on %s in the last %d ms", s->path,
                         SHMLINK_PENDING_MS);
        } else {
                *fd_ret = s->pend[i].fd;
                *pid_ret = s->pend[i].pid;
                *uid_ret = s->pend[i].uid;
                s->pend[i] = s->pend[--s->n_pend];
        }
        pthread_mutex_unlock(&s->mu);
        return r;
}

/* Removes the socket file if it is still the one we made (a psd started after us may have replaced it). */
static void remove_own(const struct shmlink_server *s) {
        struct stat st;
        if (lstat(s->path, &st) == 0 && st.st_dev == s->dev && st.st_ino == s->ino)
                unlink(s->path);
}

struct shmlink_server *shmlink_server_free(struct shmlink_server *s) {
        if (!s)
                return NULL;
        if (s->started) {
                uint64_t one = 1;
                if (write(s->wake, &one, sizeof(one)) < 0)
                        log_warning_errno(errno, "cannot stop the attach socket's thread");
                pthread_join(s->thread, NULL);
        }
        for (uint32_t i = 0; i < s->n_conns; i++)
                close(s->conns[i].fd);
        for (uint32_t i = 0; i < s->n_pend; i++)
                close(s->pend[i].fd);
        remove_own(s);
        close(s->lfd);
        close(s->wake);
        pthread_mutex_destroy(&s->mu);
        free(s);
        return NULL;
}
