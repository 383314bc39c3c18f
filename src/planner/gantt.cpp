// Gantt charts of plans, as PNG files written with zlib and as labelled SVG.
#include "tessera/planner/gantt.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "tessera/util/clock_duration.h"
#include "tessera/util/error.h"
#include "tessera/util/xml.h"

namespace tessera::planner {
namespace {

using Colour = std::array<uint8_t, 3>;

// 3x5 digits, one row per entry, the top bit the leftmost pixel.
constexpr std::array<std::array<uint8_t, 5>, 10> kDigits = {{
    {7, 5, 5, 5, 7},  // 0
    {2, 6, 2, 2, 7},  // 1
    {7, 1, 7, 4, 7},  // 2
    {7, 1, 7, 1, 7},  // 3
    {5, 5, 7, 1, 1},  // 4
    {7, 4, 7, 1, 7},  // 5
    {7, 4, 7, 5, 7},  // 6
    {7, 1, 1, 1, 1},  // 7
    {7, 5, 7, 5, 7},  // 8
    {7, 5, 7, 1, 7},  // 9
}};
constexpr int kScale = 2;  // pixels per font pixel

void fill(Image& im, int64_t x0, int64_t y0, int64_t x1, int64_t y1, const Colour& c) {
  x0 = std::clamp<int64_t>(x0, 0, im.width);
  x1 = std::clamp<int64_t>(x1, 0, im.width);
  y0 = std::clamp<int64_t>(y0, 0, im.height);
  y1 = std::clamp<int64_t>(y1, 0, im.height);
  for (int64_t y = y0; y < y1; ++y) {
    for (int64_t x = x0; x < x1; ++x) std::memcpy(&im.rgb[static_cast<size_t>((y * im.width + x) * 3)], c.data(), 3);
  }
}

// The width in pixels of `n` written in the font.
int64_t number_width(int64_t n) {
  return static_cast<int64_t>(std::to_string(n).size()) * 4 * kScale - kScale;
}

void draw_number(Image& im, int64_t x, int64_t y, int64_t n, const Colour& c) {
  for (char ch : std::to_string(n)) {
    const auto& glyph = kDigits[static_cast<size_t>(ch - '0')];
    for (int row = 0; row < 5; ++row) {
      for (int col = 0; col < 3; ++col) {
        if ((glyph[static_cast<size_t>(row)] >> (2 - col)) & 1) {
          fill(im, x + col * kScale, y + row * kScale, x + (col + 1) * kScale, y + (row + 1) * kScale, c);
        }
      }
    }
    x += 4 * kScale;
  }
}

// Ticks: a round unit (minutes or hours, in seconds) and a step in that unit giving 4-12 ticks over `makespan`.
std::pair<double, double> tick_spacing(double makespan) {
  const double unit = makespan >= 3 * 3600 ? 3600 : 60;
  double step = 1;
  for (double m : {1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0}) {
    step = m;
    if (makespan / (m * unit) <= 12) break;
  }
  return {unit, step};
}

void chunk(std::string& out, const char* type, const std::string& data) {
  const auto be32 = [&out](uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((v >> shift) & 0xff));
  };
  be32(static_cast<uint32_t>(data.size()));
  const std::string body = std::string(type, 4) + data;
  out += body;
  be32(static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(body.data()), static_cast<uInt>(body.size()))));
}

}  // namespace

Colour gantt_job_colour(int job) {
  // Tableau's 10 colours, then the same hues darkened for jobs 10-19, and so on.
  static constexpr std::array<Colour, 10> kPalette = {{{78, 121, 167},
                                                       {242, 142, 43},
                                                       {225, 87, 89},
                                                       {118, 183, 178},
                                                       {89, 161, 79},
                                                       {237, 201, 72},
                                                       {176, 122, 161},
                                                       {255, 157, 167},
                                                       {156, 117, 95},
                                                       {186, 176, 172}}};
  Colour c = kPalette[static_cast<size_t>(job % 10)];
  const double dim = std::pow(0.75, (job / 10) % 3);
  for (uint8_t& v : c) v = static_cast<uint8_t>(std::lround(v * dim));
  return c;
}

Image draw_gantt(const Schedule& s, const Cluster& cluster, const GanttLayout& layout) {
  const int64_t devices = cluster.devices();
  const int64_t row = layout.row_height > 0 ? layout.row_height : std::clamp<int64_t>(600 / devices, 4, 24);
  Image im;
  im.width = layout.width;
  im.height = layout.top + row * devices + layout.bottom;
  im.rgb.assign(static_cast<size_t>(im.width * im.height * 3), 255);
  const double makespan = std::max(1e-9, s.makespan_s());
  const int64_t plot = im.width - layout.left - 10;
  const auto x_of = [&](double t) { return layout.left + static_cast<int64_t>(std::lround(t / makespan * plot)); };
  const Colour grey = {200, 200, 200};
  const Colour black = {0, 0, 0};

  const auto [unit, step] = tick_spacing(makespan);
  const int64_t plot_bottom = layout.top + row * devices;
  for (int64_t k = 0; k * step * unit <= makespan + 1e-9; ++k) {
    const int64_t x = x_of(static_cast<double>(k) * step * unit);
    fill(im, x, layout.top, x + 1, plot_bottom + 4, grey);
    const int64_t label = static_cast<int64_t>(std::lround(static_cast<double>(k) * step));
    draw_number(im, x - number_width(label) / 2, plot_bottom + 8, label, black);
  }
  // Bars.
  for (const Placement& p : s.placements) {
    const Colour c = gantt_job_colour(p.job);
    const int64_t x0 = x_of(p.start_s);
    const int64_t x1 = std::max(x0 + 1, x_of(p.end_s));
    // One bar per run of consecutive devices (a 1-pixel gap above each run), numbered in the middle of the tallest
    // run where it is wide and tall enough.
    int64_t best_first = 0, best_rows = 0;
    for (size_t i = 0; i < p.devices.size();) {
      size_t j = i + 1;
      while (j < p.devices.size() && p.devices[j] == p.devices[j - 1] + 1) ++j;
      const int64_t first = p.devices[i];
      const int64_t rows = static_cast<int64_t>(j - i);
      fill(im, x0, layout.top + first * row + 1, x1, layout.top + (first + rows) * row, c);
      if (rows > best_rows) {
        best_first = first;
        best_rows = rows;
      }
      i = j;
    }
    const int64_t w = number_width(p.job);
    if (x1 - x0 >= w + 4 && best_rows * row >= 5 * kScale + 2) {
      const int64_t y = layout.top + best_first * row + (best_rows * row - 5 * kScale) / 2 + 1;
      draw_number(im, x0 + 2, y, p.job, {255, 255, 255});
    }
  }
  // Nodes: a line between them and each node's number in the margin.
  for (int64_t n = 0; n < cluster.nodes; ++n) {
    const int64_t y = layout.top + n * cluster.devices_per_node * row;
    if (n > 0) fill(im, 0, y, im.width, y + 1, black);
    draw_number(im, 4, y + 2, n, black);
  }
  fill(im, layout.left - 1, layout.top, layout.left, plot_bottom, black);
  return im;
}

std::string gantt_svg(const Schedule& s, const Cluster& cluster, const std::vector<std::string>& job_names) {
  const int64_t devices = cluster.devices();
  const int64_t row = std::clamp<int64_t>(600 / devices, 6, 24);
  const int64_t left = 80, top = 50, width = 1200, plot = width - left - 20;
  const int64_t plot_bottom = top + row * devices;
  const double makespan = std::max(1e-9, s.makespan_s());
  const auto x_of = [&](double t) { return static_cast<double>(left) + t / makespan * static_cast<double>(plot); };
  const auto name_of = [&](int job) {
    return job >= 0 && static_cast<size_t>(job) < job_names.size() ? job_names[static_cast<size_t>(job)]
                                                                   : fmt::format("job {}", job);
  };
  const auto rgb = [](const Colour& c) { return fmt::format("rgb({},{},{})", c[0], c[1], c[2]); };
  const int64_t legend_top = plot_bottom + 60;
  const int64_t height = legend_top + 18 * static_cast<int64_t>(s.placements.size()) + 10;
  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      width, height, width, height);
  out += fmt::format("<text x=\"{}\" y=\"20\" font-size=\"15\" font-weight=\"bold\">{} plan: makespan {}</text>\n",
                     left, util::xml_escape(s.policy), util::clock_duration(s.makespan_s()));
  out += fmt::format("<text x=\"{}\" y=\"38\" fill=\"#555\">{}</text>\n", left, util::xml_escape(cluster.describe()));
  // The time axis: grid lines, tick labels and the unit.
  const auto [unit, step] = tick_spacing(makespan);
  for (int64_t k = 0; static_cast<double>(k) * step * unit <= makespan + 1e-9; ++k) {
    const double x = x_of(static_cast<double>(k) * step * unit);
    out += fmt::format("<line x1=\"{:.1f}\" y1=\"{}\" x2=\"{:.1f}\" y2=\"{}\" stroke=\"#ccc\"/>\n", x, top, x,
                       plot_bottom + 4);
    out += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{:g}</text>\n", x, plot_bottom + 18,
                       static_cast<double>(k) * step);
  }
  out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">time ({})</text>\n", left + plot / 2,
                     plot_bottom + 36, unit == 3600 ? "hours" : "minutes");
  // Nodes: a line between them and each node's name in the margin.
  for (int64_t n = 0; n < cluster.nodes; ++n) {
    const int64_t y = top + n * cluster.devices_per_node * row;
    if (n > 0) out += fmt::format("<line x1=\"0\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n", y, width, y);
    out += fmt::format("<text x=\"4\" y=\"{}\">node {}</text>\n",
                       y + std::min<int64_t>(14, cluster.devices_per_node * row), n);
  }
  // Bars: one rectangle per run of consecutive devices; the label in the tallest run where it fits.
  for (const Placement& p : s.placements) {
    const std::string name = util::xml_escape(name_of(p.job));
    const std::string shown = fmt::format("{}, {} {}", name, p.devices.size(), util::xml_escape(cluster.device_kind));
    const std::string tip =
        fmt::format("{}: {} to {}", shown, util::clock_duration(p.start_s), util::clock_duration(p.end_s));
    const double x0 = x_of(p.start_s);
    const double w = std::max(1.0, x_of(p.end_s) - x0);
    int64_t best_first = 0, best_rows = 0;
    for (size_t i = 0; i < p.devices.size();) {
      size_t j = i + 1;
      while (j < p.devices.size() && p.devices[j] == p.devices[j - 1] + 1) ++j;
      const int64_t first = p.devices[i], rows = static_cast<int64_t>(j - i);
      out += fmt::format(
          "<rect x=\"{:.1f}\" y=\"{}\" width=\"{:.1f}\" height=\"{}\" fill=\"{}\"><title>{}</title></rect>\n", x0,
          top + first * row + 1, w, rows * row - 1, rgb(gantt_job_colour(p.job)), tip);
      if (rows > best_rows) best_first = first, best_rows = rows;
      i = j;
    }
    if (w >= 7.0 * static_cast<double>(shown.size()) && best_rows * row >= 14) {
      out += fmt::format("<text x=\"{:.1f}\" y=\"{}\" fill=\"white\">{}</text>\n", x0 + 4,
                         top + best_first * row + (best_rows * row) / 2 + 4, shown);
    }
  }
  out +=
      fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n", left, top, left, plot_bottom);
  // The legend: every job, whatever its bar's size.
  int64_t y = legend_top;
  for (const Placement& p : s.placements) {
    out += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/>\n", left, y - 10,
                       rgb(gantt_job_colour(p.job)));
    out += fmt::format("<text x=\"{}\" y=\"{}\">{}: {} {}, {} to {}</text>\n", left + 18, y,
                       util::xml_escape(name_of(p.job)), p.devices.size(), util::xml_escape(cluster.device_kind),
                       util::clock_duration(p.start_s), util::clock_duration(p.end_s));
    y += 18;
  }
  return out + "</svg>\n";
}

void write_png(const Image& im, const std::string& path) {
  // Scanlines, each with filter byte 0 (none).
  std::string raw;
  raw.reserve(static_cast<size_t>(im.height * (im.width * 3 + 1)));
  for (int64_t y = 0; y < im.height; ++y) {
    raw.push_back('\0');
    raw.append(reinterpret_cast<const char*>(&im.rgb[static_cast<size_t>(y * im.width * 3)]),
               static_cast<size_t>(im.width * 3));
  }
  uLongf packed_size = compressBound(static_cast<uLong>(raw.size()));
  std::string packed(packed_size, '\0');
  if (compress2(reinterpret_cast<Bytef*>(packed.data()), &packed_size, reinterpret_cast<const Bytef*>(raw.data()),
                static_cast<uLong>(raw.size()), Z_BEST_COMPRESSION) != Z_OK) {
    throw Error("plan", fmt::format("{}: cannot compress the chart", path));
  }
  packed.resize(packed_size);
  std::string header;
  for (int64_t v : {im.width, im.height}) {
    for (int shift = 24; shift >= 0; shift -= 8) header.push_back(static_cast<char>((v >> shift) & 0xff));
  }
  header += std::string("\x08\x02\x00\x00\x00", 5);  // 8 bits, RGB, deflate, no filter, no interlace
  std::string png = "\x89PNG\r\n\x1a\n";
  chunk(png, "IHDR", header);
  chunk(png, "IDAT", packed);
  chunk(png, "IEND", "");
  std::ofstream out(path, std::ios::binary);
  out.write(png.data(), static_cast<std::streamsize>(png.size()));
  if (!out.flush()) throw Error("plan", fmt::format("cannot write the chart to {}", path));
}

}  // namespace tessera::planner
