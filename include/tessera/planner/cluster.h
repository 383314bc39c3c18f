// The cluster a multi-job plan runs on (docs/planner.md): identical nodes of identical devices, and the links
// between them, read from a YAML file:
//
//   nodes: 8
//   devices_per_node: 8
//   device: {kind: H100, peak_tflops: 989, memory_gib: 80, mfu: 0.4}
//   intra_node: {bandwidth_gbps: 450, latency_us: 3}   # per device, one direction (NVLink)
//   inter_node: {bandwidth_gbps: 50, latency_us: 10}   # per device, one direction (one NIC per device)
//
// On a CPU machine the devices are cores (`device: {kind: cpu, ...}`), the measured GEMM rate is the peak and the
// intra-node link is shared memory.
#pragma once

#include <cstdint>
#include <string>

#include "tessera/config/reader.h"

namespace tessera::planner {

struct Link {
  double bandwidth_bytes_per_s = 0;  // per device, one direction (`bandwidth_gbps`: GB/s, 10^9 bytes)
  double latency_s = 0;              // per message (`latency_us`)
};

struct Cluster {
  int64_t nodes = 1;
  int64_t devices_per_node = 1;
  std::string device_kind = "cpu";
  double peak_flops = 0;    // per device (`peak_tflops`, 10^12 FLOP/s, at the training precision)
  double memory_bytes = 0;  // per device (`memory_gib`)
  // The fraction of peak a device sustains on a training step's compute (model FLOPs utilisation); 0.4 is what
  // well-tuned LLM training reaches on H100s. Profiled figures replace it per job.
  double mfu = 0.4;
  // The fraction of device memory a plan may use (the allocator's fragmentation and the runtime take the rest).
  double usable_memory = 0.9;
  // The fraction of a step's compute that can hide communication (FSDP's prefetch, DDP's bucketed all-reduce).
  double overlap = 0.5;
  // Seconds from a job's launch to its first step (processes, model build, checkpoint load).
  double startup_s = 60;
  Link intra_node;
  Link inter_node;

  int64_t devices() const { return nodes * devices_per_node; }
  // "8 nodes x 8 H100 (80 GiB, 989 TFLOP/s)".
  std::string describe() const;
};

// Reads a cluster section; unknown keys and impossible values are ConfigErrors naming the key.
Cluster parse_cluster(config::Section& s);
// Reads a cluster file (the whole file is the section).
Cluster load_cluster(const std::string& path);

}  // namespace tessera::planner
