/* OpenMPI peer of `mesh-bench collectives` (bench/collectives_bench.h): the
 * same ops, sizes and bus-bandwidth formulas, nccl-tests style, float32.
 *
 *   mpirun -np 2 bench/peers/mpi_collectives [-b BYTES] [-e BYTES] [-f FACTOR]
 *          [-n ITERS] [-w WARMUP] [-o OPS]
 *
 * For every op and size: `warmup` untimed calls, then `iters` calls back to
 * back; the time per call is the slowest rank's average (MPI_MAX), as in the
 * Mesh suite. Each size is then run once on deterministic data and checked
 * exactly (small integers). Rank 0 prints one JSON object per line:
 *   {"op":"all_reduce","bytes":65536,"time_us":..,"algbw_gbps":..,"busbw_gbps":..,"wrong":0}
 * Exit status 1 when any result was wrong or an argument is bad.
 *
 * Built by scripts/bench.sh with mpicc (plain C so that it needs nothing but
 * libopenmpi-dev); never part of the CMake build or of `make test`. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int64_t parse_size(const char* text) {
  char* end = NULL;
  double value = strtod(text, &end);
  switch (end && *end ? *end : ' ') {
    case 'K': case 'k': value *= 1024.0; break;
    case 'M': case 'm': value *= 1024.0 * 1024.0; break;
    case 'G': case 'g': value *= 1024.0 * 1024.0 * 1024.0; break;
    default: break;
  }
  return (int64_t)value;
}

/* Element counts and bus factor per op; buffers are sized by the caller. */
typedef struct {
  int64_t in_count;  /* elements of the send buffer */
  int64_t out_count; /* elements of the receive buffer */
  double bus_factor;
} Shape;

static Shape shape_of(const char* op, int64_t count, int n) {
  Shape s = {count, count, 1.0};
  if (strcmp(op, "all_reduce") == 0) {
    s.bus_factor = 2.0 * (n - 1) / n;
  } else if (strcmp(op, "all_gather") == 0) {
    s.in_count = count / n;
    s.bus_factor = (double)(n - 1) / n;
  } else if (strcmp(op, "reduce_scatter") == 0) {
    s.out_count = count / n;
    s.bus_factor = (double)(n - 1) / n;
  } else if (strcmp(op, "all_to_all") == 0) {
    s.bus_factor = (double)(n - 1) / n;
  }
  return s;
}

static void run_op(const char* op, float* in, float* out, int64_t count, int n) {
  if (strcmp(op, "all_reduce") == 0) {
    MPI_Allreduce(in, out, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  } else if (strcmp(op, "all_gather") == 0) {
    MPI_Allgather(in, (int)(count / n), MPI_FLOAT, out, (int)(count / n), MPI_FLOAT,
                  MPI_COMM_WORLD);
  } else if (strcmp(op, "reduce_scatter") == 0) {
    MPI_Reduce_scatter_block(in, out, (int)(count / n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  } else if (strcmp(op, "all_to_all") == 0) {
    MPI_Alltoall(in, (int)(count / n), MPI_FLOAT, out, (int)(count / n), MPI_FLOAT,
                 MPI_COMM_WORLD);
  }
}

/* Input element i of `rank`: small integers, exact in float32. */
static float input_value(int rank, int64_t i) { return (float)((rank + 1) * 3 + (i % 7)); }

static int64_t check(const char* op, const float* out, int64_t count, int rank, int n) {
  int64_t wrong = 0;
  if (strcmp(op, "all_reduce") == 0) {
    for (int64_t i = 0; i < count; ++i) {
      float want = 0;
      for (int r = 0; r < n; ++r) want += input_value(r, i);
      wrong += out[i] != want;
    }
  } else if (strcmp(op, "all_gather") == 0) {
    const int64_t chunk = count / n;
    for (int64_t i = 0; i < chunk * n; ++i) wrong += out[i] != input_value((int)(i / chunk), i % chunk);
  } else if (strcmp(op, "reduce_scatter") == 0) {
    const int64_t chunk = count / n;
    for (int64_t i = 0; i < chunk; ++i) {
      float want = 0;
      for (int r = 0; r < n; ++r) want += input_value(r, rank * chunk + i);
      wrong += out[i] != want;
    }
  } else if (strcmp(op, "all_to_all") == 0) {
    /* Block b of the output is block `rank` of rank b's input. */
    const int64_t chunk = count / n;
    for (int64_t i = 0; i < chunk * n; ++i) {
      wrong += out[i] != input_value((int)(i / chunk), rank * chunk + i % chunk);
    }
  }
  return wrong;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  int64_t min_bytes = 64 * 1024, max_bytes = 64 * 1024 * 1024;
  int factor = 4, iters = 20, warmup = 5;
  char ops_arg[256] = "all_reduce,all_gather,reduce_scatter,all_to_all";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "-b") == 0) min_bytes = parse_size(argv[i + 1]);
    else if (strcmp(argv[i], "-e") == 0) max_bytes = parse_size(argv[i + 1]);
    else if (strcmp(argv[i], "-f") == 0) factor = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "-n") == 0) iters = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "-w") == 0) warmup = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "-o") == 0) snprintf(ops_arg, sizeof ops_arg, "%s", argv[i + 1]);
    else {
      if (rank == 0) fprintf(stderr, "mpi_collectives: unknown option %s\n", argv[i]);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  if (min_bytes < 4 * n || max_bytes < min_bytes || factor < 2 || iters < 1 || warmup < 0) {
    if (rank == 0) fprintf(stderr, "mpi_collectives: bad sizes or counts\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const int64_t max_count = max_bytes / 4;
  float* in = malloc(max_count * sizeof(float));
  float* out = malloc(max_count * sizeof(float));
  if (!in || !out) MPI_Abort(MPI_COMM_WORLD, 3);
  int64_t total_wrong = 0;
  char* save = NULL;
  for (char* op = strtok_r(ops_arg, ",", &save); op; op = strtok_r(NULL, ",", &save)) {
    for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= factor) {
      int64_t count = bytes / 4;
      if (strcmp(op, "all_reduce") != 0) count -= count % n;
      const Shape s = shape_of(op, count, n);
      for (int64_t i = 0; i < s.in_count; ++i) in[i] = input_value(rank, i);
      for (int i = 0; i < warmup; ++i) run_op(op, in, out, count, n);
      MPI_Barrier(MPI_COMM_WORLD);
      const double start = MPI_Wtime();
      for (int i = 0; i < iters; ++i) run_op(op, in, out, count, n);
      double per_call = (MPI_Wtime() - start) / iters, slowest = 0;
      MPI_Reduce(&per_call, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
      /* Fresh inputs, garbage outputs, one checked call. */
      for (int64_t i = 0; i < s.in_count; ++i) in[i] = input_value(rank, i);
      memset(out, 0xff, s.out_count * sizeof(float));
      run_op(op, in, out, count, n);
      int64_t wrong = check(op, out, count, rank, n), all_wrong = 0;
      MPI_Reduce(&wrong, &all_wrong, 1, MPI_INT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
      if (rank == 0) {
        const double algbw = (double)(count * 4) / slowest / 1e9;
        printf("{\"op\":\"%s\",\"bytes\":%lld,\"count\":%lld,\"time_us\":%.3f,"
               "\"algbw_gbps\":%.6g,\"busbw_gbps\":%.6g,\"wrong\":%lld}\n",
               op, (long long)bytes, (long long)count, slowest * 1e6, algbw,
               algbw * s.bus_factor, (long long)all_wrong);
        fflush(stdout);
        total_wrong += all_wrong;
      }
    }
  }
  free(in);
  free(out);
  MPI_Bcast(&total_wrong, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  MPI_Finalize();
  return total_wrong == 0 ? 0 : 1;
}
