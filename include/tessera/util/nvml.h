// NVML, the NVIDIA driver's management library, loaded at run time (dlopen of the driver's libnvidia-ml.so.1): the
// build and CPU-only machines need no NVML. What the health monitor and the launcher's watchdog read of a GPU: its
// utilisation, its memory, its uncorrected ECC errors and the critical XID events the driver reported.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tessera::util {

// One GPU's state at one read.
struct GpuHealth {
  std::string pci_bus_id;          // "00000000:3B:00.0"
  double utilization_percent = 0;  // the fraction of the driver's last sample period a kernel ran, 0-100
  double memory_used_bytes = 0;
  double memory_total_bytes = 0;
  int64_t ecc_uncorrected = -1;  // volatile (since the driver loaded) uncorrected ECC errors; -1: not supported
  std::vector<int64_t> xids;     // critical XID events (their codes) since the previous read of this GPU
};

// A loaded and initialised NVML. Not thread-safe: one owner reads it.
class Nvml {
 public:
  // Loads and initialises NVML. Returns nullptr when it is not there (no NVIDIA driver: a CPU machine) or does not
  // initialise, with the reason in *why (e.g. "libnvidia-ml.so.1: cannot open shared object file").
  static std::unique_ptr<Nvml> open(std::string* why);
  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  // The GPUs NVML sees (all of the machine's, whatever CUDA_VISIBLE_DEVICES says).
  int device_count() const;
  // Reads the GPU with this PCI bus id (from cuda_pci_bus_id or pci_bus_id). The first read of a GPU registers for its
  // XID events, so xids lists those after it. Throws Error naming the call and NVML's message when one fails.
  GpuHealth read(const std::string& pci_bus_id);
  // The same for NVML's GPU `index` (in [0, device_count())); pci_bus_id stays empty.
  GpuHealth read_index(int index);

  struct Api;

 private:
  Nvml() = default;
  struct Watched;
  GpuHealth read_watched(Watched& w);
  std::unique_ptr<Api> api_;
  std::vector<std::unique_ptr<Watched>> watched_;
};

// The hang report's clause on a node's GPUs, from their utilisation (percent, by NVML index); empty without any GPU:
// "GPU 0 is 100% busy, GPU 1 0%: a GPU busy while no rank makes progress runs a kernel or NCCL collective that does
// not finish (a GPU hang, or a peer that never joins)", the verdict when one is at least 90% busy.
std::string describe_gpu_hang(const std::vector<double>& utilization_percent);

// The PCI bus id of CUDA device `device` as NVML writes it ("00000000:3B:00.0"), for Nvml::read; empty without CUDA.
std::string cuda_pci_bus_id(int device);

}  // namespace tessera::util
