// The predicted step-time breakdown of layouts as a horizontal stacked bar chart in SVG, written
// directly (no plotting library): one <g class="layout"> per layout, one <rect> per time term.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "triax/core/error.h"
#include "triax/plan/report.h"

namespace triax::plan {

namespace {

struct Term {
  const char* key;    // the class of its rect, and estimate_json's "time" key
  const char* label;  // the legend's word
  const char* colour;
  double TimeBreakdown::*seconds;
};

constexpr Term kTerms[] = {
    {"compute", "compute", "#4e79a7", &TimeBreakdown::compute},
    {"bubble", "pipeline bubble", "#bab0ac", &TimeBreakdown::bubble},
    {"tp_comm", "exposed TP comm", "#f28e2b", &TimeBreakdown::tp_comm},
    {"cp_comm", "exposed CP comm", "#b07aa1", &TimeBreakdown::cp_comm},
    {"pp_comm", "exposed PP comm", "#e15759", &TimeBreakdown::pp_comm},
    {"dp_comm", "exposed DP comm", "#76b7b2", &TimeBreakdown::dp_comm},
    {"optimizer", "optimizer", "#59a14f", &TimeBreakdown::optimizer},
    {"core_sharing", "core sharing", "#edc948", &TimeBreakdown::core_sharing},
};

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// A round tick step (1, 2 or 5 times a power of ten) giving about five ticks up to `top`.
double tick_step(double top) {
  const double raw = top / 5;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double f : {1.0, 2.0, 5.0})
    if (f * mag >= raw) return f * mag;
  return 10 * mag;
}

// Chart geometry, in pixels: labels left of x0, bars from x0 to x1, rows from y0 down.
struct Frame {
  double x0, x1, y0, row, top_s;
  double x(double s) const { return x0 + (x1 - x0) * s / top_s; }
};

// Which terms any layout has (the others stay out of the legend).
std::vector<const Term*> used_terms(const std::vector<Estimate>& layouts) {
  std::vector<const Term*> used;
  for (const Term& t : kTerms)
    if (std::any_of(layouts.begin(), layouts.end(), [&](const Estimate& e) { return e.time.*t.seconds > 0; }))
      used.push_back(&t);
  return used;
}

std::string legend(const std::vector<const Term*>& terms, double x, double y) {
  std::string out = "<g class=\"legend\">\n";
  for (const Term* t : terms) {
    out += fmt::format("  <rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"12\" height=\"12\" fill=\"{}\"/>"
                       "<text x=\"{:.1f}\" y=\"{:.1f}\">{}</text>\n",
                       x, y - 10, t->colour, x + 16, y, t->label);
    x += 16 + 6.6 * static_cast<double>(std::string(t->label).size()) + 18;
  }
  return out + "</g>\n";
}

std::string axis(const Frame& f, double bottom) {
  std::string out = "<g class=\"axis\">\n";
  const double step = tick_step(f.top_s);
  for (int i = 0; i * step <= f.top_s * (1 + 1e-9); ++i) {
    const double s = i * step, x = f.x(s);
    out += fmt::format("  <line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" stroke=\"#dddddd\"/>"
                       "<text x=\"{0:.1f}\" y=\"{3:.1f}\" text-anchor=\"middle\">{4:g}</text>\n",
                       x, f.y0 - 6, bottom, bottom + 16, s);
  }
  out += fmt::format("  <text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">seconds per iteration</text>\n",
                     (f.x0 + f.x1) / 2, bottom + 34);
  return out + "</g>\n";
}

std::string bar(const Estimate& e, int rank, const Frame& f, const std::vector<const Term*>& terms) {
  const double y = f.y0 + (rank - 1) * f.row, h = f.row * 0.65;
  const std::string name = describe(e.layout);
  std::string out = fmt::format("<g class=\"layout\" data-rank=\"{}\" data-layout=\"{}\" data-seconds=\"{:.6g}\">\n",
                                rank, xml_escape(name), e.seconds_per_iteration);
  out += fmt::format("  <title>{}: {:.4g} s/iter, {:.1f} TFLOP/s per GPU, MFU {:.1f}%, {:.1f} GiB</title>\n",
                     xml_escape(name), e.seconds_per_iteration, e.tflops_per_gpu, 100 * e.mfu,
                     e.memory.total() / (1024.0 * 1024.0 * 1024.0));
  out += fmt::format("  <text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\" font-family=\"monospace\">{}. {}</text>\n",
                     f.x0 - 8, y + h * 0.75, rank, xml_escape(name));
  double at = 0;
  for (const Term* t : terms) {
    const double s = e.time.*t->seconds;
    if (s <= 0) continue;
    out += fmt::format("  <rect class=\"{}\" x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.1f}\" fill=\"{}\" "
                       "data-seconds=\"{:.6g}\"><title>{}: {:.4g} s</title></rect>\n",
                       t->key, f.x(at), y, f.x(at + s) - f.x(at), h, t->colour, s, t->label, s);
    at += s;
  }
  out += fmt::format("  <text x=\"{:.1f}\" y=\"{:.1f}\">{:.4g} s, MFU {:.0f}%</text>\n", f.x(at) + 6, y + h * 0.75,
                     e.seconds_per_iteration, 100 * e.mfu);
  return out + "</g>\n";
}

}  // namespace

std::string breakdown_svg(const std::vector<Estimate>& layouts) {
  if (layouts.empty()) TRIAX_THROW(ConfigError, "no layout to plot");
  size_t label_chars = 0;
  double top = 0;
  for (const auto& e : layouts) {
    label_chars = std::max(label_chars, describe(e.layout).size() + 4);
    top = std::max(top, e.time.total());
  }
  const std::vector<const Term*> terms = used_terms(layouts);
  const double width = 1000, x0 = 20 + 7.3 * static_cast<double>(label_chars);
  Frame f{x0, width - 130, 80, 30, top > 0 ? top : 1};
  const double bottom = f.y0 + f.row * static_cast<double>(layouts.size());
  const double height = bottom + 50;
  const Estimate& first = layouts.front();
  std::string out = fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0:.0f}\" height=\"{1:.0f}\" viewBox=\"0 0 {0:.0f} {1:.0f}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"20\" y=\"24\" font-size=\"15\">{2}: predicted time per iteration on {3}, {4} GPUs "
      "(triax-plan)</text>\n",
      width, height, xml_escape(first.model.name.empty() ? "model" : first.model.name), xml_escape(first.cluster),
      first.layout.gpus());
  out += legend(terms, 20, 50);
  out += axis(f, bottom);
  for (size_t i = 0; i < layouts.size(); ++i) out += bar(layouts[i], static_cast<int>(i) + 1, f, terms);
  return out + "</svg>\n";
}

void write_breakdown_svg(const std::string& path, const std::vector<Estimate>& layouts) {
  const std::string svg = breakdown_svg(layouts);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) TRIAX_THROW(IoError, "--plot {}: cannot open for writing", path);
  out << svg;
  out.close();
  if (!out) TRIAX_THROW(IoError, "--plot {}: write failed", path);
}

}  // namespace triax::plan
