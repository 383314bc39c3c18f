// NVML through dlopen: the few entry points we call, declared with NVML's C ABI (nvml.h is not needed to build).
#include "tessera/util/nvml.h"

#include <dlfcn.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstring>

#include <fmt/format.h>

#include "tessera/util/error.h"

namespace tessera::util {
// Named rather than anonymous: Nvml's member structs below hold these types, which GCC rejects
// (-Wsubobject-linkage) when this file is compiled inside a unity batch.
namespace nvml_abi {

// NVML's C types (nvml.h): a return code, opaque handles, and the structs we read.
using nvmlReturn_t = int;
using nvmlDevice_t = struct nvmlDevice_st*;
using nvmlEventSet_t = struct nvmlEventSet_st*;
constexpr nvmlReturn_t kSuccess = 0;
constexpr nvmlReturn_t kNotSupported = 3;
constexpr unsigned long long kEventXidCritical = 0x8;  // nvmlEventTypeXidCriticalError
constexpr int kMemoryErrorUncorrected = 1;             // NVML_MEMORY_ERROR_TYPE_UNCORRECTED
constexpr int kVolatileEcc = 0;                        // NVML_VOLATILE_ECC
struct nvmlUtilization_t {
  unsigned int gpu;
  unsigned int memory;
};
struct nvmlMemory_t {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
struct nvmlEventData_t {
  nvmlDevice_t device;
  unsigned long long eventType;
  unsigned long long eventData;  // the XID for nvmlEventTypeXidCriticalError
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};

}  // namespace nvml_abi
using namespace nvml_abi;  // this file's own C ABI declarations

struct Nvml::Api {
  void* lib = nullptr;
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  const char* (*error_string)(nvmlReturn_t) = nullptr;
  nvmlReturn_t (*device_count)(unsigned int*) = nullptr;
  nvmlReturn_t (*handle_by_bus_id)(const char*, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*handle_by_index)(unsigned int, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*utilization)(nvmlDevice_t, nvmlUtilization_t*) = nullptr;
  nvmlReturn_t (*memory)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  nvmlReturn_t (*ecc_errors)(nvmlDevice_t, int, int, unsigned long long*) = nullptr;
  nvmlReturn_t (*event_set_create)(nvmlEventSet_t*) = nullptr;
  nvmlReturn_t (*register_events)(nvmlDevice_t, unsigned long long, nvmlEventSet_t) = nullptr;
  nvmlReturn_t (*event_set_wait)(nvmlEventSet_t, nvmlEventData_t*, unsigned int) = nullptr;
  nvmlReturn_t (*event_set_free)(nvmlEventSet_t) = nullptr;

  std::string message(const char* call, nvmlReturn_t rc) const {
    return fmt::format("NVML {}: {} (error {})", call, error_string != nullptr ? error_string(rc) : "?", rc);
  }
  void check(const char* call, nvmlReturn_t rc) const {
    if (rc != kSuccess) throw Error("nvml", message(call, rc));
  }
};

// A GPU read before: its handle and the event set that catches its XIDs (null when it cannot register).
struct Nvml::Watched {
  std::string bus_id;  // or "#<index>"
  nvmlDevice_t device = nullptr;
  nvmlEventSet_t events = nullptr;
};

namespace {

// Bus ids compare without case and leading zeros of the domain: "0000:3B:00.0" is "00000000:3b:00.0".
std::string normalized_bus_id(const std::string& id) {
  std::string out;
  const size_t colon = id.find(':');
  std::string domain = colon == std::string::npos ? "" : id.substr(0, colon);
  while (domain.size() > 1 && domain[0] == '0') domain.erase(0, 1);
  out = domain + (colon == std::string::npos ? id : id.substr(colon));
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

template <typename F>
bool load(void* lib, const char* name, F& fn) {
  fn = reinterpret_cast<F>(::dlsym(lib, name));
  return fn != nullptr;
}

}  // namespace

std::unique_ptr<Nvml> Nvml::open(std::string* why) {
  auto fail = [&](const std::string& reason) -> std::unique_ptr<Nvml> {
    if (why != nullptr) *why = reason;
    return nullptr;
  };
  void* lib = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* e = ::dlerror();
    return fail(e != nullptr ? e : "libnvidia-ml.so.1: cannot be loaded");
  }
  auto api = std::make_unique<Api>();
  api->lib = lib;
  const std::array<bool, 13> found = {
      load(lib, "nvmlDeviceGetHandleByIndex_v2", api->handle_by_index),
      load(lib, "nvmlInit_v2", api->init),
      load(lib, "nvmlShutdown", api->shutdown),
      load(lib, "nvmlErrorString", api->error_string),
      load(lib, "nvmlDeviceGetCount_v2", api->device_count),
      load(lib, "nvmlDeviceGetHandleByPciBusId_v2", api->handle_by_bus_id),
      load(lib, "nvmlDeviceGetUtilizationRates", api->utilization),
      load(lib, "nvmlDeviceGetMemoryInfo", api->memory),
      load(lib, "nvmlDeviceGetTotalEccErrors", api->ecc_errors),
      load(lib, "nvmlEventSetCreate", api->event_set_create),
      load(lib, "nvmlDeviceRegisterEvents", api->register_events),
      load(lib, "nvmlEventSetWait_v2", api->event_set_wait),
      load(lib, "nvmlEventSetFree", api->event_set_free),
  };
  if (std::find(found.begin(), found.end(), false) != found.end()) {
    ::dlclose(lib);
    return fail("libnvidia-ml.so.1 lacks an entry point Tessera needs (a driver older than NVML 11)");
  }
  if (const nvmlReturn_t rc = api->init(); rc != kSuccess) {
    const std::string reason = api->message("nvmlInit_v2", rc);
    ::dlclose(lib);
    return fail(reason);
  }
  std::unique_ptr<Nvml> nvml(new Nvml());
  nvml->api_ = std::move(api);
  return nvml;
}

Nvml::~Nvml() {
  for (const auto& w : watched_) {
    if (w->events != nullptr) api_->event_set_free(w->events);
  }
  api_->shutdown();
  ::dlclose(api_->lib);
}

int Nvml::device_count() const {
  unsigned int n = 0;
  api_->check("nvmlDeviceGetCount_v2", api_->device_count(&n));
  return static_cast<int>(n);
}

GpuHealth Nvml::read(const std::string& pci_bus_id) {
  for (const auto& x : watched_) {
    if (normalized_bus_id(x->bus_id) == normalized_bus_id(pci_bus_id)) return read_watched(*x);
  }
  auto fresh = std::make_unique<Watched>();
  fresh->bus_id = pci_bus_id;
  if (const nvmlReturn_t rc = api_->handle_by_bus_id(pci_bus_id.c_str(), &fresh->device); rc != kSuccess) {
    throw Error("nvml", fmt::format("GPU {}: {}", pci_bus_id, api_->message("nvmlDeviceGetHandleByPciBusId_v2", rc)));
  }
  watched_.push_back(std::move(fresh));
  return read_watched(*watched_.back());
}

GpuHealth Nvml::read_index(int index) {
  const std::string key = "#" + std::to_string(index);
  for (const auto& x : watched_) {
    if (x->bus_id == key) return read_watched(*x);
  }
  auto fresh = std::make_unique<Watched>();
  fresh->bus_id = key;
  if (const nvmlReturn_t rc = api_->handle_by_index(static_cast<unsigned int>(index), &fresh->device); rc != kSuccess) {
    throw Error("nvml", fmt::format("GPU {}: {}", index, api_->message("nvmlDeviceGetHandleByIndex_v2", rc)));
  }
  watched_.push_back(std::move(fresh));
  GpuHealth h = read_watched(*watched_.back());
  return h;
}

GpuHealth Nvml::read_watched(Watched& w) {
  if (w.events == nullptr) {
    // XID events: some GPUs and virtualised setups do not report them; then there are none to list.
    nvmlEventSet_t set = nullptr;
    if (api_->event_set_create(&set) == kSuccess) {
      if (api_->register_events(w.device, kEventXidCritical, set) == kSuccess) {
        w.events = set;
      } else {
        api_->event_set_free(set);
      }
    }
  }
  GpuHealth h;
  if (w.bus_id.empty() || w.bus_id[0] != '#') h.pci_bus_id = w.bus_id;
  nvmlUtilization_t u{};
  api_->check("nvmlDeviceGetUtilizationRates", api_->utilization(w.device, &u));
  h.utilization_percent = u.gpu;
  nvmlMemory_t m{};
  api_->check("nvmlDeviceGetMemoryInfo", api_->memory(w.device, &m));
  h.memory_used_bytes = static_cast<double>(m.used);
  h.memory_total_bytes = static_cast<double>(m.total);
  unsigned long long ecc = 0;
  const nvmlReturn_t rc = api_->ecc_errors(w.device, kMemoryErrorUncorrected, kVolatileEcc, &ecc);
  if (rc == kSuccess) {
    h.ecc_uncorrected = static_cast<int64_t>(ecc);
  } else if (rc != kNotSupported) {
    api_->check("nvmlDeviceGetTotalEccErrors", rc);
  }
  if (w.events != nullptr) {
    nvmlEventData_t e{};
    while (api_->event_set_wait(w.events, &e, 0) == kSuccess) {
      if ((e.eventType & kEventXidCritical) != 0) h.xids.push_back(static_cast<int64_t>(e.eventData));
    }
  }
  return h;
}

std::string describe_gpu_hang(const std::vector<double>& utilization_percent) {
  if (utilization_percent.empty()) return "";
  std::string out;
  bool busy = false;
  for (size_t i = 0; i < utilization_percent.size(); ++i) {
    out += fmt::format("{}GPU {} {}{:.0f}%{}", i == 0 ? "" : ", ", i, i == 0 ? "is " : "", utilization_percent[i],
                       i == 0 ? " busy" : "");
    busy = busy || utilization_percent[i] >= 90;
  }
  if (busy) {
    out +=
        ": a GPU busy while no rank makes progress runs a kernel or NCCL collective that does not finish (a GPU "
        "hang, or a peer that never joins)";
  }
  return out;
}

std::string cuda_pci_bus_id(int device) {
  std::array<char, 64> id{};
  if (::cudaDeviceGetPCIBusId(id.data(), static_cast<int>(id.size()), device) != cudaSuccess) {
    ::cudaGetLastError();  // clear it: this was a question, not a failure of the caller's work
    return "";
  }
  return id.data();
}

}  // namespace tessera::util
