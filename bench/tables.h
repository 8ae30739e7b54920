// mesh-bench's report tables: a printer per suite whose table main.cc does
// not get from the suite's own module, each printing its result to stdout
// as a Markdown table with `#` comment lines around it; Rule and Mib are the
// pieces they share. main.cc calls them once a run has succeeded.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "bench/dtensor_pack_bench.h"
#include "bench/metrics_bench.h"
#include "bench/nccl_overhead_bench.h"
#include "bench/ping_bench.h"
#include "bench/progress_bench.h"
#include "bench/rendezvous_bench.h"
#include "bench/store_bench.h"
#include "bench/waiters_bench.h"

namespace mesh::bench {

// The |---|---| line under a table's header, for columns of these widths.
std::string Rule(std::initializer_list<int> widths);
// Bytes in MiB.
double Mib(int64_t bytes);

// `warmup`: the unmeasured rounds that came first (said in the header).
void PrintRendezvous(const RendezvousBenchResult& r, int warmup);
void PrintWaiters(const WaitersBenchResult& r);
void PrintPing(const PingBenchResult& result);
// `nccl_stream`: --stream as given ("group" or "current").
void PrintNcclOverhead(const NcclOverheadResult& result, const NcclOverheadOptions& nccl,
                       const std::string& nccl_stream);
// A result that was not skipped.
void PrintDTensorPack(const DTensorPackResult& result, const DTensorPackOptions& pack);
void PrintStore(const StoreBenchResult& r, const StoreBenchOptions& store);
void PrintProgress(const ProgressBenchResult& r, const ProgressBenchOptions& progress);
void PrintMetrics(const MetricsBenchResult& r);

}  // namespace mesh::bench
