/*
 * The reference for stagelink's intra-node gather: Open MPI's
 * MPI_Allgather rebuilding a tensor of SIZE bytes from equal parts of
 * SIZE/n, in place, at the same sizes.  CSV: size,ranks,avg_us,algbw_GBps
 * (algbw = size / time, GB/s = 1e9 B/s).
 *   mpirun -np N mpi_allgather_bench [-n ITERS] SIZE...
 * SPDX-License-Identifier: MIT
 */
#include "host.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    int    rank, n, i, it, iters = 20, opt;
    size_t size;
    char  *buf;
    double t0, t, tmax;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    while ((opt = getopt(argc, argv, "n:")) != -1) {
        if (opt == 'n') {
            iters = atoi(optarg);
        }
    }
    if (rank == 0) {
        printf("size,ranks,avg_us,algbw_GBps\n");
    }
    for (i = optind; i < argc; ++i) {
        if (sl_host_parse_size(argv[i], &size) != 0 || size % (size_t)n != 0) {
            if (rank == 0) {
                fprintf(stderr, "size %s is not a multiple of %d ranks\n", argv[i], n);
            }
            continue;
        }
        buf = malloc(size);
        memset(buf, rank, size);
        for (it = 0; it < 3; ++it) { /* warm-up */
            MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf,
                          (int)(size / (size_t)n), MPI_BYTE, MPI_COMM_WORLD);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = MPI_Wtime();
        for (it = 0; it < iters; ++it) {
            MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf,
                          (int)(size / (size_t)n), MPI_BYTE, MPI_COMM_WORLD);
        }
        t = (MPI_Wtime() - t0) / iters;
        MPI_Reduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (rank == 0) {
            printf("%zu,%d,%.2f,%.3f\n", size, n, tmax * 1e6,
                   (double)size / (tmax * 1e9));
        }
        free(buf);
    }
    MPI_Finalize();
    return 0;
}
