// Cluster descriptions for the planner.
#include "tessera/planner/cluster.h"

#include <string>

#include <fmt/format.h>

#include "tessera/config/value.h"
#include "tessera/config/yaml_file.h"

namespace tessera::planner {
namespace {

Link parse_link(config::Section s, double default_gbps, double default_latency_us) {
  Link l;
  const double gbps = s.get_double("bandwidth_gbps", default_gbps);
  const double latency_us = s.get_double("latency_us", default_latency_us);
  s.check(gbps > 0, "bandwidth_gbps", "must be positive (GB/s per device, one direction)");
  s.check(latency_us >= 0, "latency_us", "must not be negative");
  s.finish();
  l.bandwidth_bytes_per_s = gbps * 1e9;
  l.latency_s = latency_us * 1e-6;
  return l;
}

}  // namespace

std::string Cluster::describe() const {
  return fmt::format("{} node{} x {} {} ({:.0f} GiB, {:.4g} TFLOP/s peak)", nodes, nodes == 1 ? "" : "s",
                     devices_per_node, device_kind, memory_bytes / (1024.0 * 1024 * 1024), peak_flops / 1e12);
}

Cluster parse_cluster(config::Section& s) {
  Cluster c;
  c.nodes = s.get_int("nodes", 1);
  s.check(c.nodes >= 1, "nodes", "must be at least 1");
  c.devices_per_node = s.require_int("devices_per_node");
  s.check(c.devices_per_node >= 1, "devices_per_node", "must be at least 1");
  {
    config::Section d = s.section("device");
    s.check(d.present(), "device", "is required: {kind, peak_tflops, memory_gib}");
    c.device_kind = d.get_string("kind", "gpu");
    c.peak_flops = d.require_double("peak_tflops") * 1e12;
    d.check(c.peak_flops > 0, "peak_tflops", "must be positive");
    c.memory_bytes = d.require_double("memory_gib") * 1024.0 * 1024 * 1024;
    d.check(c.memory_bytes > 0, "memory_gib", "must be positive");
    c.mfu = d.get_double("mfu", c.mfu);
    d.check(c.mfu > 0 && c.mfu <= 1, "mfu", "must be in (0, 1]");
    c.usable_memory = d.get_double("usable_memory", c.usable_memory);
    d.check(c.usable_memory > 0 && c.usable_memory <= 1, "usable_memory", "must be in (0, 1]");
    d.finish();
  }
  c.overlap = s.get_double("overlap", c.overlap);
  s.check(c.overlap >= 0 && c.overlap <= 1, "overlap", "must be in [0, 1]");
  c.startup_s = s.get_double("startup_s", c.startup_s);
  s.check(c.startup_s >= 0, "startup_s", "must not be negative");
  // Defaults: NVLink-class within a node, one 400 Gb/s NIC per device across nodes.
  c.intra_node = parse_link(s.section("intra_node"), 450, 3);
  c.inter_node = parse_link(s.section("inter_node"), 50, 10);
  s.finish();
  return c;
}

Cluster load_cluster(const std::string& path) {
  const config::Value root = config::load_yaml_file(path, "plan", "cluster file");
  config::ParseContext ctx(path);
  config::Section s(&root, "", ctx);
  Cluster c = parse_cluster(s);
  ctx.throw_if_unsupported();
  return c;
}

}  // namespace tessera::planner
