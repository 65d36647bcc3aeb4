/*
 * A TCP port on loopback that nobody listens on right now, for a test's
 * own rendezvous.  SPDX-License-Identifier: MIT
 */
#ifndef SL_TEST_LOOPBACK_H
#define SL_TEST_LOOPBACK_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

static inline int free_port(void)
{
    struct sockaddr_in a   = {.sin_family = AF_INET};
    socklen_t          len = sizeof(a);
    int                fd  = socket(AF_INET, SOCK_STREAM, 0), p;

    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd, (struct sockaddr *)&a, sizeof(a));
    getsockname(fd, (struct sockaddr *)&a, &len);
    p = ntohs(a.sin_port);
    close(fd);
    return p;
}

#endif
