/* TCP for the bootstrap.  SPDX-License-Identifier: MIT */
#include "sl_sock.h"
#include "sl_time.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <limits.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

/* How long one poll sleeps between progress calls. */
#define SL_SOCK_PROGRESS_MS 1
/* How long one connect attempt waits for its handshake before a fresh SYN:
 * a SYN dropped at a full accept queue is retried by the kernel only
 * after 1, 3, 7 s ... */
#define SL_SOCK_ATTEMPT_S 1.0

sl_status_t sl_sock_io(int fd, void *buf, size_t len, int writing,
                       double deadline, const sl_sock_progress_t *progress,
                       sl_errbuf_t *eb)
{
    char         *p = buf;
    struct pollfd pfd;
    ssize_t       n;
    int           rc, ms;

    while (len > 0) {
        pfd.fd     = fd;
        pfd.events = writing ? POLLOUT : POLLIN;
        ms         = sl_deadline_ms(deadline);
        if (progress != NULL && progress->fn != NULL) {
            progress->fn(progress->arg);
            ms = (ms < 0 || ms > SL_SOCK_PROGRESS_MS) ? SL_SOCK_PROGRESS_MS
                                                      : ms;
        }
        rc = poll(&pfd, 1, ms);
        if (rc == 0 && !sl_deadline_passed(deadline)) {
            continue;
        }
        if (rc == 0) {
            return sl_error(eb, STAGELINK_ERR_TIMEOUT,
                            "bootstrap %s of %zu bytes timed out; raise "
                            "STAGELINK_TIMEOUT or check that every rank runs",
                            writing ? "send" : "receive", len);
        }
        if (rc < 0) {
            if (errno == EINTR) {
                continue;
            }
            return sl_error(eb, STAGELINK_ERR_BOOTSTRAP, "bootstrap poll: %s",
                            strerror(errno));
        }
        n = writing ? send(fd, p, len, MSG_NOSIGNAL) : recv(fd, p, len, 0);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) {
            continue;
        }
        if (n <= 0) {
            return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                            "bootstrap peer closed the connection with %zu "
                            "bytes left to %s (%s); a rank exited or failed",
                            len, writing ? "send" : "receive",
                            (n < 0) ? strerror(errno) : "EOF");
        }
        p   += n;
        len -= (size_t)n;
    }
    return STAGELINK_SUCCESS;
}

static sl_status_t sl_sock_resolve(const char *host, int port, int passive,
                                   struct addrinfo **res, sl_errbuf_t *eb)
{
    struct addrinfo hints;
    char            service[16];
    int             rc;

    memset(&hints, 0, sizeof(hints));
    hints.ai_family   = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags    = passive ? AI_PASSIVE : 0;
    snprintf(service, sizeof(service), "%d", port);
    rc = getaddrinfo(host, service, &hints, res);
    if (rc != 0) {
        return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                        "cannot resolve rendezvous address %s:%d: %s",
                        host, port, gai_strerror(rc));
    }
    return STAGELINK_SUCCESS;
}

static void sl_sock_tune(int fd)
{
    int one = 1;

    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

sl_status_t sl_sock_listen(const sl_launcher_t *l, int *fd_out,
                           sl_errbuf_t *eb)
{
    struct addrinfo *res;
    sl_status_t      status;
    int              one = 1;
    int              fd;

    SL_CHECK(sl_sock_resolve(l->bind, l->port, 1, &res, eb));
    fd = socket(res->ai_family,
                res->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        status = sl_error(eb, STAGELINK_ERR_BOOTSTRAP, "socket(): %s",
                          strerror(errno));
        goto out_free;
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, res->ai_addr, res->ai_addrlen) != 0 ||
        listen(fd, SOMAXCONN) != 0) {
        status = sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                          "rank 0 cannot listen on %s:%d: %s; pick a free "
                          "STAGELINK_BOOTSTRAP_PORT (default MASTER_PORT, "
                          "which torch's store holds once torchrun or "
                          "init_process_group started one) or an address of "
                          "this host (STAGELINK_BOOTSTRAP_BIND)",
                          l->bind, l->port, strerror(errno));
        close(fd);
        goto out_free;
    }
    *fd_out = fd;
    status  = STAGELINK_SUCCESS;
out_free:
    freeaddrinfo(res);
    return status;
}

/* One non-blocking connect, polled until the deadline: a full accept
 * queue at the listener leaves a blocking connect in the kernel's SYN
 * retries for minutes.  0 once connected; else the errno, ETIMEDOUT when
 * the deadline passed first. */
static int sl_sock_connect_once(const struct addrinfo *ai, double deadline,
                                int *fd_out)
{
    struct pollfd pfd;
    socklen_t     len = sizeof(int);
    int           fd, err = 0, rc;

    fd = socket(ai->ai_family,
                ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        return errno;
    }
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        err = errno;
    }
    while (err == EINPROGRESS || err == EINTR) {
        pfd = (struct pollfd){.fd = fd, .events = POLLOUT};
        rc  = poll(&pfd, 1, sl_deadline_ms(deadline));
        if (rc == 0) {
            err = ETIMEDOUT;
        } else if (rc < 0) {
            err = (errno == EINTR) ? EINTR : errno;
        } else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) {
            err = errno;
        }
    }
    if (err != 0) {
        close(fd);
        return err;
    }
    *fd_out = fd;
    return 0;
}

sl_status_t sl_sock_connect(const char *host, int port, const char *what,
                            double deadline, int *fd_out, sl_errbuf_t *eb)
{
    struct addrinfo *res;
    sl_status_t      status;
    useconds_t       pause_us;
    int              err, fd = -1;

    SL_CHECK(sl_sock_resolve(host, port, 0, &res, eb));
    /* The listener may not be up yet: retry until the deadline, soon at
     * first (it is usually a moment away), then every 20 ms. */
    for (pause_us = 1000;; pause_us = (pause_us < 10000) ? 2 * pause_us : 20000) {
        err = sl_sock_connect_once(
            res, sl_deadline_earlier(deadline, sl_deadline(SL_SOCK_ATTEMPT_S)),
            &fd);
        if (err == 0) {
            break;
        }
        if (err == EMFILE || err == ENFILE || sl_deadline_passed(deadline)) {
            status = sl_error(eb, (err == ETIMEDOUT || err == ECONNREFUSED)
                              ? STAGELINK_ERR_TIMEOUT
                              : STAGELINK_ERR_BOOTSTRAP,
                              "cannot reach %s at %s:%d: %s%s; check "
                              "MASTER_ADDR/MASTER_PORT and that it runs (raise "
                              "STAGELINK_TIMEOUT if it starts later)", what,
                              host, port, strerror(err),
                              err == ETIMEDOUT ? " (no answer before the "
                              "deadline: its accept queue full, or a "
                              "firewall?)" : "");
            goto out_free;
        }
        usleep(pause_us);
    }
    /* Nonblocking from here on: every later read and write polls. */
    sl_sock_tune(fd);
    *fd_out = fd;
    status  = STAGELINK_SUCCESS;
out_free:
    freeaddrinfo(res);
    return status;
}

int sl_sock_accept(int lfd, char *peer, size_t len)
{
    struct sockaddr_storage sa;
    socklen_t               sa_len = sizeof(sa);
    char                    host[INET6_ADDRSTRLEN] = "?";
    int                     fd, port = 0;

    memset(&sa, 0, sizeof(sa));
    fd = accept4(lfd, (struct sockaddr *)&sa, &sa_len, SOCK_CLOEXEC);
    if (fd < 0) {
        return -1;
    }
    sl_sock_tune(fd);
    if (sa.ss_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)&sa;

        inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
        port = ntohs(in->sin_port);
    } else if (sa.ss_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)&sa;

        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
        port = ntohs(in6->sin6_port);
    }
    snprintf(peer, len, sa.ss_family == AF_INET6 ? "[%s]:%d" : "%s:%d", host,
             port);
    return fd;
}

int sl_sock_is_loopback(const char *host)
{
    struct addrinfo *res, *ai;
    int              local = 1;

    if (sl_sock_resolve(host, 0, 0, &res, NULL) != STAGELINK_SUCCESS) {
        return 0;
    }
    for (ai = res; ai != NULL && local; ai = ai->ai_next) {
        if (ai->ai_family == AF_INET) {
            const struct sockaddr_in *a = (const void *)ai->ai_addr;

            local = (ntohl(a->sin_addr.s_addr) >> 24) == 127;
        } else if (ai->ai_family == AF_INET6) {
            const struct sockaddr_in6 *a = (const void *)ai->ai_addr;

            local = IN6_IS_ADDR_LOOPBACK(&a->sin6_addr);
        } else {
            local = 0;
        }
    }
    freeaddrinfo(res);
    return local;
}

int sl_sock_fds_free(void)
{
    struct rlimit  lim;
    struct dirent *e;
    DIR           *d;
    long           open = 0;

    if (getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY ||
        lim.rlim_cur > INT_MAX) {
        return INT_MAX;
    }
    d = opendir("/proc/self/fd");
    if (d == NULL) {
        return (int)lim.rlim_cur; /* no /proc: the whole limit, as before */
    }
    while ((e = readdir(d)) != NULL) {
        open += e->d_name[0] != '.';
    }
    closedir(d);
    return (int)lim.rlim_cur - (int)open;
}
