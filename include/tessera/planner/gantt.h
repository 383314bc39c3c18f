// The plan as a Gantt chart (PNG, and SVG with labels): one row per device, time to the right, each job a bar of its
// own colour over the devices it holds, numbered as in the plan's table; a line between nodes and a tick every round
// time unit.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "tessera/planner/cluster.h"
#include "tessera/planner/schedule.h"

namespace tessera::planner {

// An RGB image, row-major, 3 bytes per pixel.
struct Image {
  int64_t width = 0;
  int64_t height = 0;
  std::vector<uint8_t> rgb;
};

struct GanttLayout {
  int64_t width = 1200;  // pixels
  int64_t left = 40;     // the margin holding the node numbers
  int64_t top = 10;
  int64_t bottom = 30;     // the margin holding the time ticks
  int64_t row_height = 0;  // per device; 0: chosen from the device count (4 to 24 pixels)
};

// The colour of job `job`'s bars, and the background.
std::array<uint8_t, 3> gantt_job_colour(int job);
inline constexpr std::array<uint8_t, 3> kGanttBackground = {255, 255, 255};

// Draws the chart; the x of time t is left + t / makespan * (width - left - 10).
Image draw_gantt(const Schedule& s, const Cluster& cluster, const GanttLayout& layout = {});

// PNG (8-bit RGB, zlib-compressed) of `image` at `path`; Error naming the path when it cannot be written.
void write_png(const Image& image, const std::string& path);

// The same chart as SVG, with words: the policy, makespan and cluster as the title; each bar named by its job
// (`job_names[placement.job]`, XML-escaped) and the devices it holds ("llama-8b, 16 H100"), where the bar is wide
// enough, and as a tooltip everywhere; node names in the margin; a time axis in hours or minutes with its unit; and a
// legend of every job with its devices and its start and end times.
std::string gantt_svg(const Schedule& s, const Cluster& cluster, const std::vector<std::string>& job_names);

}  // namespace tessera::planner
