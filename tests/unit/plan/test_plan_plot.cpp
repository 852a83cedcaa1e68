// triax-plan --plot's SVG (breakdown_svg): one bar group per layout in the given order, one rect
// per non-zero time term whose seconds and widths add up to the layout's time, bars scaled to
// the slowest, the legend holding only the terms present, and text escaped for XML.
#include <catch2/catch.hpp>

#include <regex>
#include <string>
#include <vector>

#include "triax/core/error.h"
#include "triax/plan/report.h"

using namespace triax::plan;

namespace {

Estimate layout(int tp, int pp, int dp, double compute, double bubble, double tp_comm, double dp_comm) {
  Estimate e;
  e.model.name = "m&<x>";
  e.cluster = "round";
  e.layout.tp = tp;
  e.layout.pp = pp;
  e.layout.dp = dp;
  e.layout.micro_batch = 1;
  e.time.compute = compute;
  e.time.bubble = bubble;
  e.time.tp_comm = tp_comm;
  e.time.dp_comm = dp_comm;
  e.seconds_per_iteration = e.time.total();
  e.mfu = 0.5;
  return e;
}

struct Rect {
  std::string cls;
  double x, width, seconds;
};

// The rects of each <g class="layout"> ... </g>, in order.
std::vector<std::vector<Rect>> groups(const std::string& svg) {
  std::vector<std::vector<Rect>> out;
  const std::regex g_re("<g class=\"layout\"[^>]*>([\\s\\S]*?)</g>");
  const std::regex r_re("<rect class=\"(\\w+)\" x=\"([0-9.]+)\" y=\"[0-9.]+\" width=\"([0-9.]+)\"[^>]*data-seconds=\"([0-9.e+-]+)\"");
  for (auto g = std::sregex_iterator(svg.begin(), svg.end(), g_re); g != std::sregex_iterator(); ++g) {
    const std::string body = (*g)[1];
    std::vector<Rect> rects;
    for (auto r = std::sregex_iterator(body.begin(), body.end(), r_re); r != std::sregex_iterator(); ++r)
      rects.push_back({(*r)[1], std::stod((*r)[2]), std::stod((*r)[3]), std::stod((*r)[4])});
    out.push_back(rects);
  }
  return out;
}

}  // namespace

TEST_CASE("breakdown_svg draws one stacked bar per layout, scaled to the slowest") {
  const std::vector<Estimate> ls = {layout(2, 2, 2, 10, 1, 0.5, 0), layout(4, 1, 2, 9, 0, 2, 1.5),
                                    layout(1, 4, 2, 8, 4, 0, 0.25)};
  const std::string svg = breakdown_svg(ls);
  REQUIRE(svg.rfind("<?xml", 0) == 0);
  REQUIRE(svg.find("</svg>") != std::string::npos);
  const auto gs = groups(svg);
  REQUIRE(gs.size() == ls.size());
  double left = -1, px_per_s = 0;
  for (size_t i = 0; i < ls.size(); ++i) {
    double seconds = 0, width = 0;
    for (const Rect& r : gs[i]) {
      CHECK(r.seconds > 0);  // zero terms draw nothing
      seconds += r.seconds;
      width += r.width;
      if (left < 0) left = r.x;
    }
    CHECK(seconds == Approx(ls[i].seconds_per_iteration).epsilon(1e-5));
    CHECK(gs[i].front().x == Approx(left).margin(0.01));  // every bar starts at the axis
    CHECK(gs[i].front().cls == "compute");
    if (i == 0) px_per_s = width / seconds;
    CHECK(width / seconds == Approx(px_per_s).epsilon(1e-3));  // one scale for all bars
  }
  CHECK(gs[1].size() == 3);  // compute, tp_comm, dp_comm: no bubble
  CHECK(gs[1][1].cls == "tp_comm");
  CHECK(svg.find("data-layout=\"tp2 pp2 dp2 mbs1 1f1b rc=none\"") != std::string::npos);
  // Legend: only the terms some layout has.
  CHECK(svg.find(">pipeline bubble<") != std::string::npos);
  CHECK(svg.find(">optimizer<") == std::string::npos);
  CHECK(svg.find(">exposed PP comm<") == std::string::npos);
  // Names are escaped.
  CHECK(svg.find("m&amp;&lt;x&gt;") != std::string::npos);
  CHECK(svg.find("m&<x>") == std::string::npos);
}

TEST_CASE("breakdown_svg refuses no layout, and an unwritable --plot path names it") {
  CHECK_THROWS_AS(breakdown_svg({}), triax::ConfigError);
  try {
    write_breakdown_svg("/nonexistent-dir/p.svg", {layout(1, 1, 1, 1, 0, 0, 0)});
    FAIL("no error");
  } catch (const triax::IoError& e) {
    CHECK(std::string(e.what()).find("--plot /nonexistent-dir/p.svg: cannot open for writing") != std::string::npos);
  }
}
