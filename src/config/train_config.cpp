// The training configuration's one table of options and everything driven by it: command line,
// TOML files (toml++), range checks, printing back, and the resolution for a world size.
#include "triax/config/train_config.h"

#include "triax/config/hetero.h"

#include <fmt/ranges.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <sstream>
#include <type_traits>

#include "triax/core/checked_math.h"
#include "triax/model/hf_dir.h"

namespace triax {
namespace {

template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {
  using type = T;
};

std::string toml_quote(std::string_view s);

const toml::node* node_of(const OptionInput& in) { return static_cast<const toml::node*>(in.toml_node); }

// "--tp two" or "run.toml:3: tp = "two"": where a value came from and what it was.
std::string shown(const OptionInput& in, std::string_view value) {
  if (in.toml_node) return fmt::format("{} = {}", in.where, value);
  return value.empty() ? in.where : fmt::format("{} {}", in.where, value);
}

std::string toml_shown(const toml::node& n) {
  std::ostringstream os;
  if (n.is_string()) os << '"' << n.as_string()->get() << '"';
  else if (n.is_table()) os << "{...}";
  else n.visit([&](auto&& v) { os << v; });
  std::string s = os.str();
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

const char* toml_type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a number";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::array: return "an array";
    case toml::node_type::table: return "a table";
    default: return "a date/time";
  }
}

[[noreturn]] void bad(const OptionInput& in, std::string_view value, std::string_view problem, std::string_view range) {
  TRIAX_THROW(ConfigError, "{}: {}; expected {}", shown(in, value), problem, range);
}

[[noreturn]] void wrong_type(const OptionInput& in, std::string_view range) {
  const auto& n = *node_of(in);
  bad(in, toml_shown(n), fmt::format("{} is the wrong type", toml_type_name(n)), range);
}

std::string int_range(long long lo, long long hi) {
  if (hi >= std::numeric_limits<int>::max()) return fmt::format("an integer >= {}", lo);
  return fmt::format("an integer in [{}, {}]", lo, hi);
}

// One integer from a word or a TOML node, checked against [lo, hi].
long long read_int(const OptionInput& in, const std::string& word, const toml::node* n, long long lo, long long hi) {
  const std::string range = int_range(lo, hi);
  long long v = 0;
  std::string text;
  if (n) {
    if (!n->is_integer()) wrong_type(in, range);
    v = n->as_integer()->get();
    text = std::to_string(v);
  } else {
    text = word;
    const char* end = word.data() + word.size();
    const auto [ptr, ec] = std::from_chars(word.data(), end, v);
    if (word.empty() || ec == std::errc::invalid_argument || ptr != end) bad(in, fmt::format("'{}'", word), "not an integer", range);
    if (ec == std::errc::result_out_of_range) bad(in, word, "out of range", range);
  }
  if (v < lo || v > hi) bad(in, text, "out of range", range);
  return v;
}

struct RealRange {
  double lo = 0, hi = std::numeric_limits<double>::infinity();
  bool lo_open = false, hi_open = false;
  std::string text() const {
    if (std::isinf(hi)) return fmt::format("a finite number {} {}", lo_open ? ">" : ">=", lo);
    return fmt::format("a number in {}{}, {}{}", lo_open ? "(" : "[", lo, hi, hi_open ? ")" : "]");
  }
  bool ok(double v) const {
    return std::isfinite(v) && (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
  }
};

double read_real(const OptionInput& in, const std::string& word, const toml::node* n, const RealRange& r) {
  double v = 0;
  std::string text;
  if (n) {
    if (n->is_integer()) v = static_cast<double>(n->as_integer()->get());
    else if (n->is_floating_point()) v = n->as_floating_point()->get();
    else wrong_type(in, r.text());
    text = toml_shown(*n);
  } else {
    text = word;
    const char* end = word.data() + word.size();
    const auto [ptr, ec] = std::from_chars(word.data(), end, v);
    if (word.empty() || ec != std::errc() || ptr != end) bad(in, fmt::format("'{}'", word), "not a number", r.text());
  }
  if (!r.ok(v)) bad(in, text, "out of range", r.text());
  return v;
}

bool read_bool(const OptionInput& in) {
  if (const auto* n = node_of(in)) {
    if (!n->is_boolean()) wrong_type(in, "true or false");
    return n->as_boolean()->get();
  }
  if (in.words.empty()) return true;  // a bare switch
  const auto& w = in.words[0];
  if (w == "true" || w == "1") return true;
  if (w == "false" || w == "0") return false;
  bad(in, fmt::format("'{}'", w), "not a boolean", "true or false");
}

std::string read_string(const OptionInput& in) {
  std::string v;
  if (const auto* n = node_of(in)) {
    if (!n->is_string()) wrong_type(in, "a string");
    v = n->as_string()->get();
  } else {
    v = in.words.at(0);
  }
  // TOML's \u0000 (a command line cannot carry one): it would cut every later message and path short.
  if (const size_t nul = v.find('\0'); nul != std::string::npos)
    bad(in, toml_quote(v), fmt::format("a NUL character (\\u0000) at position {}", nul), "text without NUL characters");
  return v;
}

// The integers of a list: "3,5" on the command line, [3, 5] in TOML, or `count` separate words.
std::vector<long long> read_ints(const OptionInput& in, long long lo, size_t count, const std::string& range) {
  std::vector<long long> out;
  if (const auto* n = node_of(in)) {
    const auto* a = n->as_array();
    if (!a) wrong_type(in, range);
    for (const auto& e : *a) out.push_back(read_int(in, "", &e, lo, std::numeric_limits<long long>::max()));
  } else if (in.words.size() > 1) {
    for (const auto& w : in.words) out.push_back(read_int(in, w, nullptr, lo, std::numeric_limits<long long>::max()));
  } else {
    const std::string& w = in.words.at(0);
    size_t pos = 0;
    for (;;) {
      const size_t comma = w.find(',', pos);
      const std::string part = w.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
      if (part.empty()) bad(in, fmt::format("'{}'", w), "an empty entry", range);
      out.push_back(read_int(in, part, nullptr, lo, std::numeric_limits<long long>::max()));
      if (comma == std::string::npos) break;
      pos = comma + 1;
    }
  }
  if (count && out.size() != count)
    bad(in, in.toml_node ? toml_shown(*node_of(in)) : fmt::format("{}", fmt::join(in.words, " ")),
        fmt::format("{} values", out.size()), range);
  if (!count && out.empty()) bad(in, "[]", "no values", range);
  return out;
}

std::string toml_quote(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') out += {'\\', c};
    else if (static_cast<unsigned char>(c) < 0x20) out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
    else out += c;
  }
  return out + "\"";
}

// ---- option builders: each returns one row of the table ----

template <class Get>
ConfigOption int_opt(std::string key, std::string help, Get get, long long lo,
                     long long hi = std::numeric_limits<long long>::max()) {
  using F = std::remove_reference_t<decltype(get(std::declval<TrainConfig&>()))>;
  using V = typename std::conditional_t<is_optional<F>::value, is_optional<F>, std::type_identity<F>>::type;
  ConfigOption o;
  o.key = std::move(key);
  o.help = std::move(help);
  o.range = int_range(lo, hi);
  o.set = [=](TrainConfig& c, const OptionInput& in) {
    get(c) = static_cast<V>(read_int(in, in.words.empty() ? "" : in.words[0], node_of(in), lo, hi));
  };
  o.check = [=, range = o.range, k = o.key](const TrainConfig& c) -> std::string {
    auto& f = get(const_cast<TrainConfig&>(c));
    long long v = 0;
    if constexpr (is_optional<F>::value) {
      if (!f) return {};
      v = static_cast<long long>(*f);
    } else {
      v = static_cast<long long>(f);
    }
    if (v < lo || v > hi) return fmt::format("{} = {}: out of range; expected {}", k, v, range);
    return {};
  };
  o.toml = [=](const TrainConfig& c) -> std::optional<std::string> {
    auto& f = get(const_cast<TrainConfig&>(c));
    if constexpr (is_optional<F>::value) {
      if (!f) return std::nullopt;
      return std::to_string(*f);
    } else {
      return std::to_string(f);
    }
  };
  return o;
}

// The value of a field that may be optional: a pointer to it, or nullptr when an optional is unset.
template <class F>
auto* value_of(F& f) {
  if constexpr (is_optional<F>::value) return f ? &*f : nullptr;
  else return &f;
}

// The type a field holds (T of std::optional<T>, or the field's own type).
template <class Get>
using field_value_t = typename std::conditional_t<
    is_optional<std::remove_reference_t<decltype(std::declval<Get>()(std::declval<TrainConfig&>()))>>::value,
    is_optional<std::remove_reference_t<decltype(std::declval<Get>()(std::declval<TrainConfig&>()))>>,
    std::type_identity<std::remove_reference_t<decltype(std::declval<Get>()(std::declval<TrainConfig&>()))>>>::type;

template <class Get>
ConfigOption real_opt(std::string key, std::string help, Get get, RealRange r) {
  using F = field_value_t<Get>;
  ConfigOption o;
  o.key = std::move(key);
  o.help = std::move(help);
  o.range = r.text();
  o.set = [=](TrainConfig& c, const OptionInput& in) {
    get(c) = static_cast<F>(read_real(in, in.words.empty() ? "" : in.words[0], node_of(in), r));
  };
  o.check = [=, k = o.key](const TrainConfig& c) -> std::string {
    const auto* v = value_of(get(const_cast<TrainConfig&>(c)));
    if (v && !r.ok(*v)) return fmt::format("{} = {}: out of range; expected {}", k, *v, r.text());
    return {};
  };
  o.toml = [=](const TrainConfig& c) -> std::optional<std::string> {
    const auto* v = value_of(get(const_cast<TrainConfig&>(c)));
    if (!v) return std::nullopt;
    return fmt::format("{}", *v);  // shortest text that reads back as this F
  };
  return o;
}

template <class Get>
ConfigOption bool_opt(std::string key, std::string help, Get get, bool invert = false) {
  ConfigOption o;
  o.key = std::move(key);
  o.help = std::move(help);
  o.range = "true or false";
  o.arity = 0;
  o.set = [=](TrainConfig& c, const OptionInput& in) { get(c) = read_bool(in) != invert; };
  o.check = [](const TrainConfig&) { return std::string(); };
  o.toml = [=](const TrainConfig& c) -> std::optional<std::string> {
    const auto* v = value_of(get(const_cast<TrainConfig&>(c)));
    if (!v) return std::nullopt;
    return (*v != invert) ? "true" : "false";
  };
  return o;
}

template <class Get>
ConfigOption string_opt(std::string key, std::string help, Get get, std::vector<std::string> choices = {}) {
  ConfigOption o;
  o.key = std::move(key);
  o.help = std::move(help);
  o.range = choices.empty() ? "a string" : fmt::format("one of {}", fmt::join(choices, ", "));
  o.set = [=, range = o.range](TrainConfig& c, const OptionInput& in) {
    std::string v = read_string(in);
    if (!choices.empty() && std::find(choices.begin(), choices.end(), v) == choices.end())
      bad(in, toml_quote(v), "not a known value", range);
    get(c) = std::move(v);
  };
  o.check = [=, k = o.key, range = o.range](const TrainConfig& c) -> std::string {
    const std::string& v = get(const_cast<TrainConfig&>(c));
    if (!choices.empty() && std::find(choices.begin(), choices.end(), v) == choices.end())
      return fmt::format("{} = '{}': not a known value; expected {}", k, v, range);
    return {};
  };
  o.toml = [=](const TrainConfig& c) -> std::optional<std::string> { return toml_quote(get(const_cast<TrainConfig&>(c))); };
  return o;
}

// An enum option: its names are the enum's one table (EnumNames<E>, next to the enum).
template <class Get>
ConfigOption enum_opt(std::string key, std::string help, Get get) {
  using E = field_value_t<Get>;
  ConfigOption o;
  o.key = std::move(key);
  o.help = std::move(help);
  o.range = fmt::format("one of {}", enum_choices<E>());
  o.set = [=, range = o.range](TrainConfig& c, const OptionInput& in) {
    const std::string v = read_string(in);
    const std::optional<E> e = find_enum<E>(v);
    if (!e) bad(in, toml_quote(v), "not a known value", range);
    get(c) = *e;
  };
  o.check = [](const TrainConfig&) { return std::string(); };
  o.toml = [=](const TrainConfig& c) -> std::optional<std::string> {
    const auto* v = value_of(get(const_cast<TrainConfig&>(c)));
    if (!v) return std::nullopt;
    return toml_quote(enum_name(*v));
  };
  return o;
}

#define TRIAX_FIELD(expr) [](TrainConfig& c) -> auto& { return c.expr; }

constexpr long long kMaxInt = std::numeric_limits<int>::max();
constexpr long long kMaxI64 = std::numeric_limits<long long>::max();

ConfigOption pipeline_layers_opt() {
  ConfigOption o;
  o.key = "pipeline-layers";
  o.help = "layers per stage for an uneven split, e.g. 3,5";
  o.range = "a list of integers >= 1 (e.g. 3,5 or [3, 5])";
  o.set = [range = o.range](TrainConfig& c, const OptionInput& in) {
    c.pipeline_layers.clear();
    for (long long v : read_ints(in, 1, 0, range)) {
      if (v > kMaxInt) bad(in, std::to_string(v), "out of range", range);
      c.pipeline_layers.push_back(static_cast<int>(v));
    }
  };
  o.check = [range = o.range](const TrainConfig& c) -> std::string {
    for (int v : c.pipeline_layers)
      if (v < 1) return fmt::format("pipeline-layers = [{}]: out of range; expected {}", fmt::join(c.pipeline_layers, ", "), range);
    return {};
  };
  o.toml = [](const TrainConfig& c) -> std::optional<std::string> {
    if (c.pipeline_layers.empty()) return std::nullopt;
    return fmt::format("[{}]", fmt::join(c.pipeline_layers, ", "));
  };
  return o;
}

// The words of a list option given as text: "a,b" on the command line or as a TOML string, or a
// TOML array of strings; entries never empty.
std::vector<std::string> read_words(const OptionInput& in, const std::string& range) {
  std::vector<std::string> out;
  if (const auto* n = node_of(in); n && n->is_array()) {
    for (const auto& e : *n->as_array()) {
      if (!e.is_string()) wrong_type(in, range);
      out.push_back(e.as_string()->get());
    }
  } else {
    const std::string w = read_string(in);
    for (size_t pos = 0;;) {
      const size_t comma = w.find(',', pos);
      out.push_back(w.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
      if (comma == std::string::npos) break;
      pos = comma + 1;
    }
  }
  for (const auto& w : out)
    if (w.empty()) bad(in, toml_quote(fmt::format("{}", fmt::join(out, ","))), "an empty entry", range);
  return out;
}

void read_class_name(const OptionInput& in, const std::string& name, const std::string& range) {
  if (const std::string why = device_class_problem(name); !why.empty())
    bad(in, toml_quote(name), fmt::format("not a device class name: {}", why), range);
}

ConfigOption dp_microbatches_opt() {
  ConfigOption o;
  o.key = "dp-microbatches";
  o.help = "uneven data-parallel shares: micro-batches per DP replica (6,2) or per device class (fast=6,slow=2)";
  o.range = "counts >= 1, one per DP replica (6,2) or per device class (fast=6,slow=2)";
  o.set = [range = o.range](TrainConfig& c, const OptionInput& in) {
    c.dp_microbatches.clear();
    if (const auto* n = node_of(in); n && n->is_array()) {
      for (long long v : read_ints(in, 1, 0, range)) c.dp_microbatches.push_back(DpShare{"", v});
      return;
    }
    for (const std::string& w : read_words(in, range)) {
      const size_t eq = w.find('=');
      DpShare d;
      if (eq != std::string::npos) read_class_name(in, d.device_class = w.substr(0, eq), range);
      d.count = read_int(in, eq == std::string::npos ? w : w.substr(eq + 1), nullptr, 1, kMaxI64);
      if (!c.dp_microbatches.empty() && c.dp_microbatches.front().device_class.empty() != d.device_class.empty())
        bad(in, toml_quote(w), "counts per replica mixed with counts per class", range);
      c.dp_microbatches.push_back(std::move(d));
    }
  };
  o.check = [range = o.range](const TrainConfig& c) -> std::string {
    const std::string text = format_dp_microbatches(c.dp_microbatches);
    for (const auto& d : c.dp_microbatches) {
      if (d.count < 1) return fmt::format("dp-microbatches = \"{}\": out of range; expected {}", text, range);
      // Built in code, as the flag refuses it: the first entry decides per replica or per class.
      if (d.device_class.empty() != c.dp_microbatches.front().device_class.empty())
        return fmt::format("dp-microbatches = \"{}\": counts per replica mixed with counts per class; expected {}",
                           text, range);
    }
    return {};
  };
  o.toml = [](const TrainConfig& c) -> std::optional<std::string> {
    if (c.dp_microbatches.empty()) return std::nullopt;
    return toml_quote(format_dp_microbatches(c.dp_microbatches));
  };
  return o;
}

ConfigOption stage_classes_opt() {
  ConfigOption o;
  o.key = "stage-classes";
  o.help = "the device class (TRIAX_DEVICE_CLASS) each pipeline stage runs on, e.g. fast,slow";
  o.range = "one device class name per pipeline stage (fast,slow)";
  o.set = [range = o.range](TrainConfig& c, const OptionInput& in) {
    c.stage_classes = read_words(in, range);
    for (const auto& w : c.stage_classes) read_class_name(in, w, range);
  };
  o.check = [](const TrainConfig&) { return std::string(); };
  o.toml = [](const TrainConfig& c) -> std::optional<std::string> {
    if (c.stage_classes.empty()) return std::nullopt;
    return toml_quote(fmt::format("{}", fmt::join(c.stage_classes, ",")));
  };
  return o;
}

ConfigOption rampup_opt() {
  ConfigOption o;
  o.key = "rampup-batch-size";
  o.help = "START INCREMENT SAMPLES: grow the global batch";
  o.range = "three integers: start >= 1, increment >= 1, samples >= 0";
  o.arity = 3;
  o.set = [range = o.range](TrainConfig& c, const OptionInput& in) {
    const auto v = read_ints(in, 0, 3, range);
    if (v[0] < 1 || v[1] < 1) bad(in, fmt::format("[{}]", fmt::join(v, ", ")), "out of range", range);
    c.rampup = BatchRampup{v[0], v[1], v[2]};
  };
  o.check = [range = o.range](const TrainConfig& c) -> std::string {
    if (c.rampup && (c.rampup->start < 1 || c.rampup->increment < 1 || c.rampup->samples < 0))
      return fmt::format("rampup-batch-size = [{}, {}, {}]: out of range; expected {}", c.rampup->start,
                         c.rampup->increment, c.rampup->samples, range);
    return {};
  };
  o.toml = [](const TrainConfig& c) -> std::optional<std::string> {
    if (!c.rampup) return std::nullopt;
    return fmt::format("[{}, {}, {}]", c.rampup->start, c.rampup->increment, c.rampup->samples);
  };
  return o;
}

// The table, one function per section (the order here is the order of --help and of the printed
// file; the flag names are fixed whatever the section).
using Options = std::vector<ConfigOption>;

// The block's choices (Megatron's flags): each overrides the preset's when given.
void block_options(Options& t) {
  t.push_back(enum_opt("normalization", "override the preset's norm: LayerNorm (GPT-2) or RMSNorm (Llama)",
                       TRIAX_FIELD(normalization)));
  t.push_back(real_opt("norm-epsilon", "override the norm's epsilon (presets: 1e-5)", TRIAX_FIELD(norm_epsilon),
                       {0, 1, true, false}));
  t.push_back(bool_opt("swiglu", "SwiGLU MLP down(silu(gate(x)) * up(x)) instead of GELU (Llama presets: on)",
                       TRIAX_FIELD(swiglu)));
  t.push_back(enum_opt("position-embedding-type", "override the preset's positions: learned_absolute (GPT-2) or "
                       "rope (rotary, Llama)", TRIAX_FIELD(position_embedding)));
  t.push_back(real_opt("rotary-base", "RoPE's base theta (Llama 3 presets: 500000; needs rope positions)",
                       TRIAX_FIELD(rotary_base), {1, std::numeric_limits<double>::infinity(), true, false}));
  t.push_back(bool_opt("use-rope-scaling", "Llama 3.1 RoPE frequency scaling (low 1, high 4, original context 8192)",
                       TRIAX_FIELD(use_rope_scaling)));
  t.push_back(real_opt("rope-scaling-factor", "factor of --use-rope-scaling (default 8)",
                       TRIAX_FIELD(rope_scaling_factor), {1, 1e6}));
  t.push_back(bool_opt("group-query-attention", "grouped-query attention over --num-query-groups key/value heads",
                       TRIAX_FIELD(group_query_attention)));
  t.push_back(int_opt("num-query-groups", "key/value heads with --group-query-attention (divides the heads; tp "
                      "divides it)", TRIAX_FIELD(num_query_groups), 1, kMaxInt));
  t.push_back(bool_opt("untie-embeddings-and-output-weights", "an LM head of its own (lm_head.weight) instead of "
                       "the embedding's transpose", TRIAX_FIELD(untie_embeddings)));
  t.push_back(bool_opt("disable-bias-linear", "no biases on the linear layers (Llama presets: none)",
                       TRIAX_FIELD(disable_bias_linear)));
}

void model_options(Options& t) {
  t.push_back(string_opt("model", "model preset", TRIAX_FIELD(model), GptConfig::preset_names()));
  t.push_back(int_opt("num-layers", "override the preset's layer count", TRIAX_FIELD(layers), 1, kMaxInt));
  t.push_back(int_opt("num-attention-heads", "override the preset's heads", TRIAX_FIELD(heads), 1, kMaxInt));
  t.push_back(int_opt("hidden-size", "override the preset's hidden size", TRIAX_FIELD(hidden), 1, kMaxInt));
  t.push_back(int_opt("ffn-hidden-size", "override the MLP size (default 4 x hidden)", TRIAX_FIELD(ffn), 1, kMaxInt));
  t.push_back(int_opt("vocab-size", "override the vocabulary", TRIAX_FIELD(vocab), 2, kMaxInt));
  t.push_back(int_opt("max-position-embeddings", "override the position table size", TRIAX_FIELD(max_seq), 1, kMaxInt));
  block_options(t);
  t.push_back(int_opt("moe-every", "every K-th layer is a mixture-of-experts layer (0: none)", TRIAX_FIELD(moe_every), 0,
                      kMaxInt));
  t.push_back(int_opt("experts", "experts per MoE layer", TRIAX_FIELD(experts), 1, kMaxInt));
  t.push_back(int_opt("topk", "experts per token", TRIAX_FIELD(topk), 1, 2));
  t.push_back(real_opt("capacity-factor", "expert capacity factor", TRIAX_FIELD(capacity_factor), {0, 1e6, true, false}));
  t.push_back(bool_opt("no-drop", "no token dropping (capacity = the largest load)", TRIAX_FIELD(no_drop)));
  t.push_back(real_opt("moe-aux-coef", "weight of the load-balancing loss", TRIAX_FIELD(moe_aux_coef), {0, 1e6}));
}

// --zero1: Megatron's old spelling, the same as --zero 1 (false: --zero 0). Never written back to
// TOML: the `zero` key carries the level.
ConfigOption zero1_alias_opt() {
  ConfigOption o;
  o.key = "zero1";
  o.help = "alias of --zero 1";
  o.alias_of = "zero";
  o.range = "true or false";
  o.arity = 0;
  o.set = [](TrainConfig& c, const OptionInput& in) { c.zero = read_bool(in) ? 1 : 0; };
  o.check = [](const TrainConfig&) { return std::string(); };
  o.toml = [](const TrainConfig&) -> std::optional<std::string> { return std::nullopt; };
  return o;
}

// --tp / --pp: one size, or sizes in order of preference ("2,1", [2, 1]): the first becomes the
// field, the list its choices (resolve_train_config takes the first layout that fits the world).
template <class Get, class GetChoices>
ConfigOption size_choices_opt(std::string key, std::string help, Get get, GetChoices get_choices) {
  ConfigOption o;
  o.key = std::move(key);
  o.help = std::move(help);
  o.range = "an integer >= 1, or a list of them in order of preference (e.g. 2,1 or [2, 1])";
  o.set = [=, range = o.range](TrainConfig& c, const OptionInput& in) {
    std::vector<int> v;
    const auto* n = node_of(in);
    const bool one = n ? !n->is_array() : in.words.size() == 1 && in.words[0].find(',') == std::string::npos;
    const std::vector<long long> xs =
        one ? std::vector<long long>{read_int(in, n ? "" : in.words[0], n, 1, kMaxInt)} : read_ints(in, 1, 0, range);
    for (long long x : xs) {
      if (x > kMaxInt) bad(in, std::to_string(x), "out of range", range);
      if (std::find(v.begin(), v.end(), static_cast<int>(x)) != v.end())
        bad(in, std::to_string(x), "listed twice", range);
      v.push_back(static_cast<int>(x));
    }
    get(c) = v.front();
    get_choices(c) = v.size() > 1 ? v : std::vector<int>{};
  };
  o.check = [=, range = o.range, k = o.key](const TrainConfig& c) -> std::string {
    const auto& ch = get_choices(const_cast<TrainConfig&>(c));
    const int v = get(const_cast<TrainConfig&>(c));
    if (v < 1) return fmt::format("{} = {}: out of range; expected {}", k, v, range);
    for (int x : ch)
      if (x < 1) return fmt::format("{} = [{}]: out of range; expected {}", k, fmt::join(ch, ", "), range);
    return {};
  };
  o.toml = [=](const TrainConfig& c) -> std::optional<std::string> {
    const auto& ch = get_choices(const_cast<TrainConfig&>(c));
    if (!ch.empty()) return fmt::format("[{}]", fmt::join(ch, ", "));
    return std::to_string(get(const_cast<TrainConfig&>(c)));
  };
  return o;
}

void parallel_options(Options& t) {
  t.push_back(size_choices_opt("tp", "tensor-parallel size, or sizes in order of preference (2,1: the first whose "
                               "layout fits the world; docs/FAULTS.md, elastic training)", TRIAX_FIELD(tp),
                               TRIAX_FIELD(tp_choices)));
  t.push_back(size_choices_opt("pp", "pipeline-parallel size, or sizes in order of preference (like --tp)",
                               TRIAX_FIELD(pp), TRIAX_FIELD(pp_choices)));
  t.push_back(int_opt("dp", "data-parallel size (default world / (tp x cp x pp))", TRIAX_FIELD(dp), 1, kMaxInt));
  t.push_back(int_opt("cp", "context-parallel size: each sequence split over cp ranks (ring attention)", TRIAX_FIELD(cp),
                      1, kMaxInt));
  t.push_back(string_opt("cp-comm-type", "context parallelism's K/V exchange: p2p (ring, overlapped) or allgather",
                         TRIAX_FIELD(cp_comm_type), {"p2p", "allgather"}));
  t.push_back(int_opt("vpp", "virtual chunks per pipeline stage (interleaved schedule)", TRIAX_FIELD(vpp), 1, kMaxInt));
  t.push_back(int_opt("ep", "expert-parallel size (divides dp)", TRIAX_FIELD(ep), 1, kMaxInt));
  t.push_back(string_opt("order", "grid axis order, fastest first", TRIAX_FIELD(order),
                         {"tp-dp-pp", "tp-pp-dp", "dp-tp-pp", "dp-pp-tp", "pp-tp-dp", "pp-dp-tp", "tp-cp-dp-pp",
                          "tp-cp-pp-dp", "cp-tp-dp-pp"}));
  t.push_back(bool_opt("allow-tp-across-hosts", "allow TP groups spanning hosts", TRIAX_FIELD(allow_tp_across_hosts)));
  t.push_back(pipeline_layers_opt());
  t.push_back(stage_classes_opt());
  t.push_back(dp_microbatches_opt());
  t.push_back(enum_opt("schedule", "pipeline schedule", TRIAX_FIELD(schedule)));
  t.push_back(bool_opt("sequence-parallel", "split LayerNorm/residual regions over TP by tokens",
                       TRIAX_FIELD(sequence_parallel)));
  t.push_back(enum_opt("recompute", "activation recomputation", TRIAX_FIELD(recompute)));
  t.push_back(int_opt("zero", "ZeRO level: 0 none, 1 optimizer state, 2 + gradients, 3 + parameters sharded over dp",
                      TRIAX_FIELD(zero), 0, 3));
  t.push_back(zero1_alias_opt());
  t.push_back(int_opt("zero-shard-size", "HSDP: with --zero 2 or 3, shard inside groups of this many DP ranks "
                      "(divides dp) and all-reduce across the groups; 0: one group of all dp", TRIAX_FIELD(zero_shard_size),
                      0, kMaxInt));
  t.push_back(bool_opt("no-zero-prefetch", "ZeRO-3: gather each unit when it is needed instead of one unit ahead "
                       "(the baseline of the overlap figure)", TRIAX_FIELD(zero_prefetch), /*invert=*/true));
  t.push_back(real_opt("bucket-mb", "DP gradient bucket size (MiB)", TRIAX_FIELD(bucket_mb), {0, 1 << 20, true, false}));
  t.push_back(bool_opt("no-overlap-grad-reduce", "reduce gradients after backward instead of during it",
                       TRIAX_FIELD(overlap_grad_reduce), /*invert=*/true));
  t.push_back(int_opt("moe-chunks", "token chunks overlapping all-to-all with expert compute", TRIAX_FIELD(moe_chunks), 1,
                      kMaxInt));
}

void training_options(Options& t) {
  t.push_back(int_opt("seq-length", "tokens per sample (default: max positions)", TRIAX_FIELD(seq), 1, kMaxInt));
  t.push_back(int_opt("micro-batch-size", "samples per micro-batch", TRIAX_FIELD(micro_batch), 1, kMaxI64));
  t.push_back(int_opt("global-batch-size", "samples per iteration over all DP ranks", TRIAX_FIELD(global_batch), 1, kMaxI64));
  t.push_back(int_opt("num-micro-batches", "micro-batches per iteration (gradient accumulation)",
                      TRIAX_FIELD(num_micro_batches), 1, kMaxI64));
  t.push_back(rampup_opt());
  t.push_back(int_opt("train-iters", "iterations", TRIAX_FIELD(train_iters), 1, kMaxI64));
  t.push_back(int_opt("seed", "seed of initialisation and generated data", TRIAX_FIELD(seed), 0, kMaxI64));
  t.push_back(string_opt("backend", "where the step runs: cpu, cpu-checked (buffers inaccessible outside the "
                         "backend: a check, slower), cpu-emulated (the CPU computing in the --bf16/--fp16 type with the cuda backend's "
                         "buffer types checked at every op: a test of mixed precision without a GPU), or cuda (one GPU per rank, the local rank's; NCCL for device "
                         "buffers)", TRIAX_FIELD(backend), enum_names<BackendKind>()));
  t.push_back(bool_opt("bf16", "mixed precision: bfloat16 activations and weight copy, float32 masters, gradients "
                       "and Adam moments (cuda, or cpu-emulated; not on the cpu backends)", TRIAX_FIELD(bf16)));
  t.push_back(bool_opt("fp16", "mixed precision: float16 activations and weight copy with a dynamic loss scale, "
                       "float32 masters, gradients and Adam moments (cuda, or cpu-emulated; not on the cpu backends)", TRIAX_FIELD(fp16)));
}

void optimizer_options(Options& t) {
  t.push_back(real_opt("lr", "peak learning rate", TRIAX_FIELD(lr), {0, 1e6, false, false}));
  t.push_back(real_opt("min-lr", "final learning rate", TRIAX_FIELD(min_lr), {0, 1e6, false, false}));
  t.push_back(int_opt("lr-warmup-iters", "linear warm-up iterations", TRIAX_FIELD(warmup_iters), 0, kMaxI64));
  t.push_back(int_opt("lr-decay-iters", "iteration where decay reaches min-lr (default train-iters)",
                      TRIAX_FIELD(decay_iters), 1, kMaxI64));
  t.push_back(enum_opt("lr-decay-style", "learning-rate decay", TRIAX_FIELD(lr_decay)));
  t.push_back(real_opt("weight-decay", "AdamW decoupled weight decay", TRIAX_FIELD(adamw.weight_decay), {0, 1e6}));
  t.push_back(real_opt("adam-beta1", "AdamW beta1", TRIAX_FIELD(adamw.beta1), {0, 1, false, true}));
  t.push_back(real_opt("adam-beta2", "AdamW beta2", TRIAX_FIELD(adamw.beta2), {0, 1, false, true}));
  t.push_back(real_opt("adam-eps", "AdamW epsilon", TRIAX_FIELD(adamw.eps), {0, 1, true, false}));
  t.push_back(real_opt("clip-grad", "clip the global gradient norm (0: off)", TRIAX_FIELD(clip_grad), {0, 1e12}));
}

void data_options(Options& t) {
  t.push_back(string_opt("data", "llm.c token shards (a.bin,b.bin or 'train_*.bin'), a Megatron indexed dataset "
                         "(PREFIX[.bin|.idx]), a text file, or synthetic (default); docs/DATA.md", TRIAX_FIELD(data)));
  t.push_back(bool_opt("no-data-shuffle", "visit training samples in file order (default: seeded shuffle per epoch)",
                       TRIAX_FIELD(data_shuffle), /*invert=*/true));
  t.push_back(bool_opt("data-respect-eod", "samples never cross a document boundary (Megatron format)",
                       TRIAX_FIELD(data_respect_eod)));
  t.push_back(string_opt("valid-data", "validation set (same formats as --data)", TRIAX_FIELD(valid_data)));
  t.push_back(int_opt("eval-interval", "validation loss every N iterations (0: never)", TRIAX_FIELD(eval_interval), 0,
                      kMaxI64));
  t.push_back(int_opt("eval-iters", "global batches per validation", TRIAX_FIELD(eval_iters), 1, kMaxI64));
}

void checkpoint_options(Options& t) {
  t.push_back(string_opt("save", "directory to save checkpoints in (docs/CHECKPOINTS.md)", TRIAX_FIELD(save)));
  t.push_back(int_opt("save-interval", "save every N iterations (0: only at the end and on SIGTERM/SIGUSR1)",
                      TRIAX_FIELD(save_interval), 0, kMaxI64));
  t.push_back(real_opt("save-interval-minutes", "also save when this many minutes passed since the last save (0: off; "
                       "rank 0's clock decides for every rank)", TRIAX_FIELD(save_interval_minutes), {0, 1e7}));
  t.push_back(int_opt("keep-last", "checkpoints kept under --save (0: all)", TRIAX_FIELD(keep_last), 0, kMaxInt));
  t.push_back(string_opt("load", "resume from the newest complete checkpoint in this directory", TRIAX_FIELD(load)));
  t.push_back(string_opt("init-from", "start from pretrained weights: HF GPT-2 safetensors, an llm.c .bin, or an HF "
                         "Llama model directory (config.json + safetensors)", TRIAX_FIELD(init_from)));
  t.push_back(string_opt("export-hf", "at the end, write the model as HF GPT2LMHeadModel safetensors (a Llama-family "
                         "model: an HF LlamaForCausalLM directory)", TRIAX_FIELD(export_hf)));
}

void metrics_options(Options& t) {
  t.push_back(string_opt("metrics-jsonl", "write one JSON object per iteration here", TRIAX_FIELD(metrics_jsonl)));
  t.push_back(int_opt("metrics-port", "rank 0 serves Prometheus /metrics on this port (0: any free port)",
                      TRIAX_FIELD(metrics_port), 0, 65535));
  t.push_back(string_opt("metrics-bind", "address the metrics endpoint listens on", TRIAX_FIELD(metrics_bind)));
  t.push_back(string_opt("metrics-textfile", "rewrite this Prometheus textfile atomically after each iteration",
                         TRIAX_FIELD(metrics_textfile)));
  t.push_back(real_opt("metrics-linger", "keep serving /metrics this many seconds after the last iteration",
                       TRIAX_FIELD(metrics_linger), {0, 86400}));
  t.push_back(string_opt("profile-steps",
                         "record a timeline of iterations A:B (1-based, inclusive) into --profile-dir (Chrome trace)",
                         TRIAX_FIELD(profile_steps)));
  t.push_back(string_opt("profile-dir", "directory of the timeline: trace_rank{R}.json per rank, merged trace.json",
                         TRIAX_FIELD(profile_dir)));
}

void faults_options(Options& t) {
  t.push_back(real_opt("stall-timeout", "seconds without a finished iteration before the watchdog dumps the flight "
                       "recorder and ends the job (0: off; docs/FAULTS.md)", TRIAX_FIELD(stall_timeout), {0, 1e9}));
  t.push_back(int_opt("max-skipped-iterations", "end the run after K consecutive iterations skipped for a non-finite "
                      "gradient norm (0: never)", TRIAX_FIELD(max_skipped_iterations), 0, kMaxI64));
  t.push_back(real_opt("straggler-factor", "report a rank whose compute time stays above this factor times the "
                       "median", TRIAX_FIELD(straggler_factor), {1, 1e6}));
  t.push_back(real_opt("loss-spike-zscore", "log a loss more than this many standard deviations above the recent "
                       "window (0: off)", TRIAX_FIELD(loss_spike_zscore), {0, 1e6}));
}

#undef TRIAX_FIELD

std::vector<ConfigOption> build_options() {
  const std::pair<ConfigSection, void (*)(Options&)> sections[] = {
      {ConfigSection::model, model_options},         {ConfigSection::parallel, parallel_options},
      {ConfigSection::training, training_options},   {ConfigSection::optimizer, optimizer_options},
      {ConfigSection::data, data_options},           {ConfigSection::checkpoint, checkpoint_options},
      {ConfigSection::metrics, metrics_options},     {ConfigSection::faults, faults_options}};
  Options t;
  for (const auto& [section, add] : sections) {
    const size_t first = t.size();
    add(t);
    for (size_t i = first; i < t.size(); ++i) t[i].section = section;
  }
  return t;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  std::iota(prev.begin(), prev.end(), size_t{0});
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// The candidate nearest to a misspelled name ("train_iters" -> "train-iters"), or "" when none is near.
std::string nearest(std::string_view name, const std::vector<std::string_view>& candidates) {
  std::string k(name);
  std::replace(k.begin(), k.end(), '_', '-');
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const std::string_view c : candidates) {
    size_t d = edit_distance(k, c);
    if (k.size() >= 4 && c.rfind(k, 0) == 0) d = std::min<size_t>(d, 1);  // a truncated name
    if (d < best_d) best_d = d, best = c;
  }
  return best_d <= std::max<size_t>(2, k.size() / 3) ? best : std::string();
}

std::string did_you_mean(std::string_view key, std::string_view prefix) {
  const std::string near = nearest_train_option(key);
  return near.empty() ? std::string() : fmt::format(" (did you mean '{}{}'?)", prefix, near);
}

std::string section_list() {
  std::string s;
  for (const auto& e : EnumNames<ConfigSection>::table) s += fmt::format("{}[{}]", s.empty() ? "" : ", ", e.name);
  return s;
}

// A top-level table that is not a section: a typo of one, or an option written as a table.
[[noreturn]] void unknown_section(const std::string& source, int64_t line, const std::string& name) {
  std::vector<std::string_view> names;
  for (const auto& e : EnumNames<ConfigSection>::table) names.push_back(e.name);
  std::string hint;
  if (const std::string near = nearest(name, names); !near.empty()) hint = fmt::format(" (did you mean [{}]?)", near);
  else if (const ConfigOption* o = find_train_option(name))
    hint = fmt::format(" ('{}' is a key: write `{} = ...` under [{}])", name, name, enum_name(o->section));
  TRIAX_THROW(ConfigError, "{}:{}: unknown section [{}]{}; the sections are {}", source, line, name, hint,
              section_list());
}

// One `key = value` of a config file, at the top level (section == nullopt) or inside a section.
// first_line[option] remembers where each option was given, so that a second time is refused
// (TOML itself refuses a key twice in one table, not once flat and once in its section).
void apply_config_key(TrainConfig& cfg, const toml::node& node, const std::string& key, const std::string& source,
                      std::optional<ConfigSection> section, std::map<const ConfigOption*, int64_t>& first_line) {
  const int64_t line = node.source().begin.line;
  const std::string in_section = section ? fmt::format(" in [{}]", enum_name(*section)) : std::string();
  if (node.is_table())
    TRIAX_THROW(ConfigError, "{}:{}: '{}'{} is a table; inside a section every line is `key = value` (e.g. "
                "[training] train-iters = 3)", source, line, key, in_section);
  const ConfigOption* o = find_train_option(key);
  if (!o) {
    std::string hint = did_you_mean(key, "");
    if (const ConfigOption* near = find_train_option(nearest_train_option(key)); near && section &&
                                                                              near->section != *section)
      hint = fmt::format(" (did you mean '{}' in [{}]?)", near->key, enum_name(near->section));
    TRIAX_THROW(ConfigError, "{}:{}: unknown key '{}'{}{}", source, line, key, in_section, hint);
  }
  if (section && o->section != *section)
    TRIAX_THROW(ConfigError, "{}:{}: '{}' belongs in [{}], not [{}]", source, line, key, enum_name(o->section),
                enum_name(*section));
  if (const auto [it, fresh] = first_line.emplace(o, line); !fresh)  // at the top level and in its section
    TRIAX_THROW(ConfigError, "{}:{}: '{}' is given twice (also on line {})", source, std::max(line, it->second), key,
                std::min(line, it->second));
  OptionInput in;
  in.toml_node = &node;
  in.where = fmt::format("{}:{}: {}", source, line, key);
  o->set(cfg, in);
}

}  // namespace

const std::vector<ConfigOption>& train_options() {
  static const std::vector<ConfigOption> table = build_options();
  return table;
}

const ConfigOption* find_train_option(std::string_view key) {
  for (const auto& o : train_options())
    if (o.key == key) return &o;
  return nullptr;
}

std::string nearest_train_option(std::string_view key) {
  std::vector<std::string_view> keys;
  for (const auto& o : train_options()) keys.push_back(o.key);
  return nearest(key, keys);
}

void apply_config_text(TrainConfig& cfg, std::string_view text, const std::string& source_name) {
  // A raw NUL byte: toml++ would stop or describe it with the byte itself, which ends the printed
  // message there. Name the line, the column and the key instead.
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos) {
    const size_t line_start = text.rfind('\n', nul) == std::string_view::npos ? 0 : text.rfind('\n', nul) + 1;
    const size_t line = 1 + static_cast<size_t>(std::count(text.begin(), text.begin() + static_cast<ptrdiff_t>(nul), '\n'));
    std::string_view key = text.substr(line_start, nul - line_start);
    key = key.substr(0, std::min(key.find('='), key.size()));
    while (!key.empty() && (key.back() == ' ' || key.back() == '\t')) key.remove_suffix(1);
    while (!key.empty() && (key.front() == ' ' || key.front() == '\t')) key.remove_prefix(1);
    TRIAX_THROW(ConfigError, "{}:{}:{}: a NUL byte{}; a config file is UTF-8 text without NUL characters", source_name,
                line, nul - line_start + 1, key.empty() ? std::string() : fmt::format(" in the value of key '{}'", key));
  }
  toml::table root;
  try {
    root = toml::parse(text, source_name);
  } catch (const toml::parse_error& e) {
    TRIAX_THROW(ConfigError, "{}:{}:{}: malformed TOML: {}", source_name, e.source().begin.line,
                e.source().begin.column, e.description());
  }
  std::map<const ConfigOption*, int64_t> first_line;
  for (const auto& [k, node] : root) {
    const std::string name(k.str());
    if (node.is_array_of_tables())
      TRIAX_THROW(ConfigError, "{}:{}: [[{}]] is an array of tables; a section is written [{}]", source_name,
                  node.source().begin.line, name, name);
    if (!node.is_table()) {  // a flat file (written before sections), or a key before the first section
      apply_config_key(cfg, node, name, source_name, std::nullopt, first_line);
      continue;
    }
    const std::optional<ConfigSection> section = find_enum<ConfigSection>(name);
    if (!section) unknown_section(source_name, node.source().begin.line, name);
    for (const auto& [key, value] : *node.as_table())
      apply_config_key(cfg, value, std::string(key.str()), source_name, section, first_line);
  }
}

void apply_config_file(TrainConfig& cfg, const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) TRIAX_THROW(IoError, "--config {}: cannot open: {}", path, std::strerror(errno));
  std::string text;
  char buf[65536];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
  const bool failed = std::ferror(f);
  std::fclose(f);
  if (failed) TRIAX_THROW(IoError, "--config {}: read failed (is it a directory?)", path);
  apply_config_text(cfg, text, path);
}

namespace {

// --help: every flag under the heading of the section its key goes in within a --config file.
std::string help_text(std::string_view program, std::string_view description) {
  std::string h = fmt::format("{}\nusage: {} [--config FILE.toml] [--flag value ...]\n\n", description, program);
  h += fmt::format("  {:<28} {}\n", "--config FILE",
                   "TOML file of `flag-name = value` lines, each under its [section] below (or all at the top "
                   "level); flags given here win");
  for (const auto& sec : EnumNames<ConfigSection>::table) {
    h += fmt::format("\n[{}]\n", sec.name);
    for (const auto& o : train_options()) {
      if (o.section != sec.value) continue;
      const auto def = o.toml(TrainConfig{});
      h += fmt::format("  --{:<26} {} ({}{})\n", o.key + (o.arity == 0 ? "" : o.arity == 3 ? " A B C" : " V"), o.help,
                       o.range, def ? fmt::format("; default {}", *def) : "");
    }
  }
  return h;
}

}  // namespace

CommandLine parse_train_command_line(int argc, const char* const* argv, std::string_view program,
                                     std::string_view description) {
  CommandLine out;
  // Pass 1: find --config (applied first, whatever its position); pass 2: every other flag.
  struct Given {
    const ConfigOption* opt;
    OptionInput in;
  };
  std::vector<Given> given;
  std::optional<std::string> config_file;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      out.help = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0 || arg.size() == 2)
      TRIAX_THROW(ConfigError, "unexpected argument '{}': {} takes only --flag value pairs (see --help)", arg, program);
    std::string key = arg.substr(2);
    std::optional<std::string> inline_value;
    if (const auto eq = key.find('='); eq != std::string::npos) {
      inline_value = key.substr(eq + 1);
      key.resize(eq);
    }
    auto take = [&](int n) {
      std::vector<std::string> words;
      if (inline_value) {
        words.push_back(*inline_value);
        return words;
      }
      for (int k = 0; k < n; ++k) {
        if (i + 1 >= argc || std::string_view(argv[i + 1]).rfind("--", 0) == 0)
          TRIAX_THROW(ConfigError, "--{} needs {} value{}{}", key, n, n > 1 ? "s" : "",
                      find_train_option(key) ? fmt::format(": {}", find_train_option(key)->range) : std::string());
        words.emplace_back(argv[++i]);
      }
      return words;
    };
    if (key == "config") {
      config_file = take(1)[0];
      continue;
    }
    const ConfigOption* o = find_train_option(key);
    if (!o) TRIAX_THROW(ConfigError, "unknown flag --{}{}", key, did_you_mean(key, "--"));
    Given g{o, {}};
    g.in.where = "--" + key;
    g.in.words = take(o->arity);
    given.push_back(std::move(g));
  }
  if (out.help) {
    out.help_text = help_text(program, description);
    return out;
  }
  if (config_file) apply_config_file(out.cfg, *config_file);
  for (const auto& g : given) g.opt->set(out.cfg, g.in);
  return out;
}

void check_ranges(const TrainConfig& cfg) {
  for (const auto& o : train_options())
    if (std::string why = o.check(cfg); !why.empty()) throw ConfigError(why);
}

std::string to_toml(const TrainConfig& cfg, const std::function<std::string(std::string_view)>& comment) {
  std::string s;
  for (const auto& sec : EnumNames<ConfigSection>::table) {
    std::string lines;
    for (const auto& o : train_options()) {
      if (o.section != sec.value) continue;
      const auto v = o.toml(cfg);
      if (!v) continue;
      const std::string note = comment ? comment(o.key) : std::string();
      lines += fmt::format("{} = {}{}\n", o.key, *v, note.empty() ? "" : "  # " + note);
    }
    if (!lines.empty()) s += fmt::format("{}[{}]\n{}", s.empty() ? "" : "\n", sec.name, lines);
  }
  return s;
}

namespace {

// Products of sizes the model's code holds in an int (a dimension, a padded vocabulary), checked
// before anything multiplies them unchecked: ConfigError naming the flags, never a wrapped size.
void check_model_sizes(const GptConfig& m, int tp) {
  constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
  if (m.ffn <= 0) checked_product<int>("the MLP size 4 x --hidden-size", {4, m.n_embd});
  checked_product<int>("the QKV projection's rows 3 x --hidden-size", {3, m.n_embd});
  const int64_t pad = std::lcm<int64_t>(std::max(1, m.vocab_pad_to), tp);
  const int64_t padded = (static_cast<int64_t>(m.vocab) + pad - 1) / pad * pad;
  require(padded <= kMaxInt, "--vocab-size {} padded to a multiple of lcm({}, tp {}) = {} is {}: too large (at most {})",
          m.vocab, m.vocab_pad_to, tp, pad, padded, kMaxInt);
}

// The block's flags over the preset's block (Megatron's semantics: --num-query-groups only with
// --group-query-attention, --rope-scaling-factor only with the scaling on, the rotary flags only
// with rotary positions); ConfigError naming the flags.
void apply_block_flags(const TrainConfig& cfg, GptConfig& m) {
  if (cfg.normalization) m.norm = *cfg.normalization;
  if (cfg.norm_epsilon) m.norm_eps = *cfg.norm_epsilon;
  if (cfg.swiglu) m.swiglu = *cfg.swiglu;
  if (cfg.position_embedding) m.positions = *cfg.position_embedding;
  if (cfg.untie_embeddings) m.tied_embeddings = !*cfg.untie_embeddings;
  if (cfg.disable_bias_linear) m.bias = !*cfg.disable_bias_linear;
  if (cfg.num_query_groups && cfg.group_query_attention != true)
    TRIAX_THROW(ConfigError, "--num-query-groups {} needs --group-query-attention (as in Megatron, the query groups "
                "apply only with it)", *cfg.num_query_groups);
  if (cfg.group_query_attention == false) m.n_kv_head = 0;
  if (cfg.group_query_attention == true) {
    const bool preset_groups = m.n_kv_head > 0 && m.n_kv_head != m.n_head;
    require(cfg.num_query_groups || preset_groups, "--group-query-attention needs --num-query-groups N: the preset "
            "'{}' has no query groups of its own (Megatron's default of one group is not assumed)", cfg.model);
    if (cfg.num_query_groups) m.n_kv_head = *cfg.num_query_groups;
  }
  const bool rope = m.positions == PositionEmbedding::rope;
  require(rope || (!cfg.rotary_base && !cfg.use_rope_scaling.value_or(false)),
          "--{} applies to rotary position embeddings, but the positions are {} (give --position-embedding-type rope)",
          cfg.rotary_base ? "rotary-base" : "use-rope-scaling", enum_name(m.positions));
  if (cfg.rotary_base) m.rope_theta = *cfg.rotary_base;
  if (cfg.use_rope_scaling == false) m.rope_scaling.llama3 = false;
  if (cfg.use_rope_scaling == true && !m.rope_scaling.llama3) m.rope_scaling = RopeScaling{true, 8.0, 1.0, 4.0, 8192};
  require(!cfg.rope_scaling_factor || m.rope_scaling.llama3, "--rope-scaling-factor {} needs --use-rope-scaling (without "
          "it --model {} has no rotary frequency scaling)", cfg.rope_scaling_factor.value_or(0), cfg.model);
  if (cfg.rope_scaling_factor) m.rope_scaling.factor = *cfg.rope_scaling_factor;
  if (!rope) {  // unused without rotary positions: the defaults, so that one model compares equal to itself
    m.rope_theta = GptConfig{}.rope_theta;
    m.rope_scaling = RopeScaling{};
  }
}

// The block as flags (every one given, so a resolved configuration reproduces the block whatever
// the preset); the rotary flags only with rotary positions.
void fill_block_flags(TrainConfig& e, const GptConfig& m) {
  e.normalization = m.norm;
  e.norm_epsilon = m.norm_eps;
  e.swiglu = m.swiglu;
  e.position_embedding = m.positions;
  const bool rope = m.positions == PositionEmbedding::rope;
  e.rotary_base = rope ? std::optional<double>(m.rope_theta) : std::nullopt;
  e.use_rope_scaling = rope ? std::optional<bool>(m.rope_scaling.llama3) : std::nullopt;
  e.rope_scaling_factor = rope && m.rope_scaling.llama3 ? std::optional<double>(m.rope_scaling.factor) : std::nullopt;
  const bool groups = m.kv_heads() != m.n_head;
  e.group_query_attention = groups;
  e.num_query_groups = groups ? std::optional<int>(m.kv_heads()) : std::nullopt;
  e.untie_embeddings = !m.tied_embeddings;
  e.disable_bias_linear = !m.bias;
}

// "--model llama-tiny --num-query-groups 3 --tp 2": the flags that shaped the model, for the
// messages of GptConfig::validate (which knows the numbers, not the flags).
std::string model_flags(const TrainConfig& cfg) {
  std::string s = fmt::format("--model {}", cfg.model);
  for (const auto& o : train_options()) {
    if (o.section != ConfigSection::model || o.key == "model") continue;
    const auto v = o.toml(cfg);
    if (!v || o.toml(TrainConfig{}) == v) continue;  // not given (or the default of a plain field)
    if (o.arity == 0) s += *v == "true" ? fmt::format(" --{}", o.key) : fmt::format(" --{}={}", o.key, *v);
    else s += fmt::format(" --{} {}", o.key, v->front() == '"' ? v->substr(1, v->size() - 2) : *v);
  }
  return s + fmt::format(" --tp {}", cfg.tp);
}

// --export-hf writes HF GPT2LMHeadModel safetensors (GPT-2's block, one tied embedding) or an HF
// LlamaForCausalLM directory (RMSNorm, SwiGLU, rope): a model neither can hold is refused here,
// before training, not by the writer after the last iteration.
void check_export_hf(const TrainConfig& cfg, const GptConfig& m) {
  if (cfg.export_hf.empty()) return;
  require(cfg.moe_every == 0, "--export-hf {}: MoE layers (--moe-every {}) have no place in HF GPT2LMHeadModel or "
          "LlamaForCausalLM; drop --export-hf or the MoE layers", cfg.export_hf, cfg.moe_every);
  if (m.is_gpt2()) {
    require(m.tied_embeddings, "--export-hf {}: HF GPT2LMHeadModel safetensors hold one tied embedding, but this "
            "GPT-2 block has an untied head (--untie-embeddings-and-output-weights)", cfg.export_hf);
    return;
  }
  try {
    check_hf_llama(m);
  } catch (const ConfigError& err) {
    TRIAX_THROW(ConfigError, "--export-hf {}: {}: {} (an HF LlamaForCausalLM directory is written for a model "
                "whose block is not GPT-2's)", cfg.export_hf, model_flags(cfg), err.what());
  }
}

// The batch plan for dp ranks (the default: micro-batch 4, 2 x pp micro-batches), checked for
// what the step holds in ints and for the pipeline schedule (which bounds pp x vpp x micro-batches).
// shares: micro-batches per DP replica (--dp-microbatches), empty for an even split.
BatchPlan resolve_train_batch(const TrainConfig& cfg, int dp, int seq, const std::vector<int64_t>& shares) {
  const int P = cfg.pp, V = cfg.vpp;
  const ScheduleKind kind = cfg.schedule;
  BatchConfig bc{cfg.global_batch.value_or(0), cfg.micro_batch.value_or(0), cfg.num_micro_batches.value_or(0)};
  if (!bc.global_batch && !bc.micro_batch && !bc.num_micro_batches) {
    bc.micro_batch = 4;
    bc.num_micro_batches = 2 * static_cast<int64_t>(P);  // enough micro-batches to fill the pipeline
  }
  if (!shares.empty()) {
    require(!cfg.num_micro_batches, "--dp-microbatches {} gives every replica's micro-batches: drop --num-micro-batches {}",
            format_dp_microbatches(cfg.dp_microbatches), cfg.num_micro_batches.value_or(0));
    require(!cfg.rampup, "--dp-microbatches {} cannot be combined with a batch ramp-up (--rampup-batch-size)",
            format_dp_microbatches(cfg.dp_microbatches));
  }
  const BatchPlan plan = shares.empty() ? resolve_batch(bc, dp)
                                        : resolve_batch_shares(cfg.global_batch.value_or(0), cfg.micro_batch.value_or(0), shares, dp);
  // The step counts micro-batches and their tokens in ints (the executor, the kernels' row counts).
  constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
  require(plan.num_micro_batches <= kMaxInt, "{}: {} micro-batches per iteration is too many (at most {})",
          plan.describe(), plan.num_micro_batches, kMaxInt);
  const int tokens = checked_product<int>("micro-batch x seq-length (tokens per micro-batch)", {plan.micro_batch, seq});
  require(!cfg.sequence_parallel || tokens % cfg.tp == 0,
          "sequence parallelism splits micro-batch {} x seq {} = {} tokens over tp {}: not divisible",
          plan.micro_batch, seq, tokens, cfg.tp);
  const BatchSchedule batches(plan, cfg.rampup);
  validate_schedule_config(kind, P, V, static_cast<int>(batches.num_micro_batches(0)));
  for (int d = 0; d < dp; ++d) validate_schedule_config(kind, P, V, static_cast<int>(plan.micro_batches_of(d)));
  return plan;
}

// The compute type from --bf16 / --fp16, refused where the backend cannot compute in it.
DType resolve_compute_dtype(const TrainConfig& cfg) {
  require(!(cfg.bf16 && cfg.fp16), "--bf16 and --fp16 are mutually exclusive: give one compute type (neither: "
          "float32)");
  if (!cfg.bf16 && !cfg.fp16) return DType::f32;
  const char* flag = cfg.bf16 ? "--bf16" : "--fp16";
  const BackendKind be = parse_enum<BackendKind>(cfg.backend);
  require(be != BackendKind::cpu && be != BackendKind::cpu_checked,
          "{} needs a backend that computes in {}: --backend {} computes in float32 only (mixed precision runs on "
          "the cuda backend, or emulated on the CPU with --backend cpu-emulated)", flag, cfg.bf16 ? "bfloat16" : "float16", cfg.backend);
  return cfg.bf16 ? DType::bf16 : DType::f16;
}

}  // namespace

std::optional<std::pair<int64_t, int64_t>> parse_profile_steps(const std::string& text) {
  if (text.empty()) return std::nullopt;
  const auto colon = text.find(':');
  long long a = 0, b = 0;
  size_t ea = 0, eb = 0;
  try {
    if (colon == std::string::npos) throw std::invalid_argument("no colon");
    a = std::stoll(text.substr(0, colon), &ea);
    b = std::stoll(text.substr(colon + 1), &eb);
  } catch (const std::exception&) {
    ea = eb = std::string::npos;
  }
  if (colon == std::string::npos || ea != colon || eb != text.size() - colon - 1 || a < 1 || b < a)
    TRIAX_THROW(ConfigError, "--profile-steps '{}': expected A:B, the first and last iteration to record with "
                "1 <= A <= B (e.g. 3:4)", text);
  return std::pair<int64_t, int64_t>{a, b};
}

// --profile-steps and --profile-dir: a well-formed window, and somewhere to write it.
static void check_profile(const TrainConfig& cfg) {
  parse_profile_steps(cfg.profile_steps);
  require(cfg.profile_steps.empty() || !cfg.profile_dir.empty(),
          "--profile-steps {} needs --profile-dir DIR (where the timeline files go)", cfg.profile_steps);
}

// Context parallelism: the zigzag cuts every sequence into 2 cp chunks of equal length.
static void check_context_parallel(const TrainConfig& cfg, int seq) {
  if (cfg.cp == 1) return;
  require(seq % (2 * cfg.cp) == 0,
          "--seq-length {} is not divisible by 2 x cp = {}: context parallelism cuts every sequence into 2 cp equal "
          "chunks (rank r holds chunks r and 2 cp - 1 - r)",
          seq, 2 * cfg.cp);
}

// HSDP groups: --zero-shard-size only with ZeRO-2/3, dividing dp.
static void check_zero(const TrainConfig& cfg, int dp) {
  if (cfg.zero_shard_size == 0) return;
  require(cfg.zero >= 2, "--zero-shard-size {} (HSDP) needs --zero 2 or 3, not --zero {}", cfg.zero_shard_size, cfg.zero);
  require(dp % cfg.zero_shard_size == 0, "--zero-shard-size {} does not divide the data-parallel size {}",
          cfg.zero_shard_size, dp);
}

// The data-parallel size: --dp, or the world divided by tp x cp x pp.
static int resolve_dp(const TrainConfig& cfg, int W) {
  const bool cp = cfg.cp > 1;
  const int64_t tp_pp = cp ? checked_product("tp x cp x pp", {cfg.tp, cfg.cp, cfg.pp}) : checked_product("tp x pp", {cfg.tp, cfg.pp});
  if (cfg.dp) {
    const int64_t ranks = cp ? checked_product("tp x cp x pp x dp", {cfg.tp, cfg.cp, cfg.pp, *cfg.dp})
                             : checked_product("tp x pp x dp", {cfg.tp, cfg.pp, *cfg.dp});
    if (cfg.cp > 1)
      require(ranks == W, "tp x cp x pp x dp = {} x {} x {} x {} = {} but the world has {} ranks", cfg.tp, cfg.cp,
              cfg.pp, *cfg.dp, ranks, W);
    require(ranks == W, "tp x pp x dp = {} x {} x {} = {} but the world has {} ranks", cfg.tp, cfg.pp, *cfg.dp, ranks, W);
    return *cfg.dp;
  } else if (cfg.cp > 1) {
    require(W % tp_pp == 0, "the world of {} ranks is not divisible by tp {} x cp {} x pp {} = {}", W, cfg.tp, cfg.cp,
            cfg.pp, tp_pp);
    return static_cast<int>(W / tp_pp);
  } else {
    require(W % tp_pp == 0, "the world of {} ranks is not divisible by tp {} x pp {} = {}", W, cfg.tp, cfg.pp, tp_pp);
    return static_cast<int>(W / tp_pp);
  }
}

// The ranks' device classes (checked against --stage-classes), the batch plan (uneven shares from
// --dp-microbatches) and the batch sizes written back into the explicit configuration.
static void resolve_batch_and_classes(const TrainConfig& cfg, int W, std::vector<std::string> rank_classes,
                                      ResolvedTrainConfig& r) {
  TrainConfig& e = r.explicit_cfg;
  const int PV = cfg.pp * cfg.vpp, L = r.model.n_layer;
  require(rank_classes.empty() || static_cast<int>(rank_classes.size()) == W, "{} device classes for {} ranks",
          rank_classes.size(), W);
  r.rank_classes = rank_classes.empty() ? std::vector<std::string>(static_cast<size_t>(W), kDefaultDeviceClass)
                                        : std::move(rank_classes);
  const GridLayout layout(W, GridShape{cfg.tp, cfg.pp, r.dp, cfg.ep, cfg.order, cfg.cp});
  check_stage_classes(cfg, layout, r.rank_classes);
  r.batch = resolve_train_batch(cfg, r.dp, r.seq, resolve_dp_shares(cfg, layout, r.rank_classes));
  check_shares_collectives(cfg, r.batch.shares);
  // After the schedule's bound on pp x vpp x micro-batches: the list of virtual stages is small.
  if (r.stage_layers.empty()) r.stage_layers.assign(static_cast<size_t>(PV), L / PV);
  e.micro_batch = r.batch.micro_batch;
  e.global_batch = r.batch.global_batch;
  // With uneven shares --dp-microbatches says it (the resolved file must not give both).
  e.num_micro_batches = r.batch.shares.empty() ? std::optional<int64_t>(r.batch.num_micro_batches) : std::nullopt;
}

// resolve_train_config for one (tp, pp): the lists of choices are resolved by the caller.
static ResolvedTrainConfig resolve_layout(const TrainConfig& cfg, int world_size, std::vector<std::string> rank_classes,
                                          const std::vector<std::string>& hosts) {
  check_ranges(cfg);
  check_profile(cfg);
  ResolvedTrainConfig r;
  TrainConfig& e = r.explicit_cfg;
  e = cfg;
  r.compute = resolve_compute_dtype(cfg);
  const int W = world_size;
  r.dp = resolve_dp(cfg, W);
  e.dp = r.dp;
  check_zero(cfg, r.dp);

  GptConfig& m = r.model;
  m = GptConfig::preset(cfg.model);
  if (cfg.layers) m.n_layer = *cfg.layers;
  if (cfg.heads) m.n_head = *cfg.heads;
  if (cfg.hidden) m.n_embd = *cfg.hidden;
  if (cfg.ffn) m.ffn = *cfg.ffn;
  if (cfg.vocab) m.vocab = *cfg.vocab;
  if (cfg.max_seq) m.max_seq = *cfg.max_seq;
  apply_block_flags(cfg, m);
  check_model_sizes(m, cfg.tp);
  try {
    m.validate(cfg.tp);
  } catch (const ConfigError& err) {
    TRIAX_THROW(ConfigError, "{}: {}", model_flags(cfg), err.what());
  }
  e.layers = m.n_layer, e.heads = m.n_head, e.hidden = m.n_embd, e.ffn = m.ffn_size(), e.vocab = m.vocab,
  e.max_seq = m.max_seq;
  fill_block_flags(e, m);
  check_export_hf(cfg, m);
  r.seq = cfg.seq.value_or(m.max_seq);
  // RoPE has no position table: a longer --seq-length extends max_seq (the rotary angles are
  // computed, nothing per position is learned), unless max-position-embeddings was given.
  if (m.positions == PositionEmbedding::rope && !cfg.max_seq && r.seq > m.max_seq) e.max_seq = m.max_seq = r.seq;
  require(r.seq <= m.max_seq, "--seq-length {} exceeds the model's position table: expected 1 <= seq-length <= {} "
          "(max-position-embeddings)", r.seq, m.max_seq);
  e.seq = r.seq;
  check_context_parallel(cfg, r.seq);

  const ScheduleKind kind = cfg.schedule;
  require(cfg.vpp == 1 || kind == ScheduleKind::interleaved, "--vpp {} needs the interleaved schedule (got '{}')",
          cfg.vpp, schedule_kind_name(kind));
  require(kind != ScheduleKind::interleaved || cfg.vpp >= 2,
          "the interleaved schedule needs --vpp >= 2 virtual chunks per stage (got {})", cfg.vpp);

  const int P = cfg.pp, V = cfg.vpp, L = m.n_layer;
  const int PV = checked_product<int>("pp x vpp (virtual pipeline stages)", {P, V});
  if (!cfg.pipeline_layers.empty()) {
    require(V == 1, "--pipeline-layers gives one count per stage; it cannot be combined with --vpp {}", V);
    require(static_cast<int>(cfg.pipeline_layers.size()) == P, "--pipeline-layers has {} counts for pp {} stages",
            cfg.pipeline_layers.size(), P);
    const int64_t sum = std::accumulate(cfg.pipeline_layers.begin(), cfg.pipeline_layers.end(), int64_t{0});
    require(sum == L, "--pipeline-layers [{}] sum to {} but the model has {} layers", fmt::join(cfg.pipeline_layers, ","),
            sum, L);
    r.stage_layers = cfg.pipeline_layers;
  } else {
    require(L % PV == 0,
            "{} layers cannot be split evenly over pp {} x vpp {} = {} virtual stages (give --pipeline-layers for an "
            "uneven split)",
            L, P, V, PV);
  }

  if (cfg.moe_every > 0) {
    require(r.dp % cfg.ep == 0, "expert-parallel size ep={} must divide dp={}", cfg.ep, r.dp);
    MoeConfig& mc = r.moe;
    mc.experts = cfg.experts;
    mc.top_k = cfg.topk;
    mc.capacity_factor = cfg.capacity_factor;
    mc.drop_tokens = !cfg.no_drop;
    mc.aux_loss_coef = static_cast<float>(cfg.moe_aux_coef);
    mc.chunks = cfg.moe_chunks;
    mc.validate(cfg.ep);
    for (int l = 0; l < L; ++l) r.moe_layers += (l + 1) % cfg.moe_every == 0;
  } else {
    require(cfg.ep == 1, "--ep {} needs MoE layers (--moe-every K)", cfg.ep);
  }

  resolve_batch_and_classes(cfg, W, std::move(rank_classes), r);
  // With the hosts known (a choice among --tp sizes), a tp group across hosts is refused here, so
  // that the next choice is tried; otherwise the grid refuses it when it is built.
  if (!hosts.empty())
    check_tp_placement(GridLayout(W, GridShape{cfg.tp, cfg.pp, r.dp, cfg.ep, cfg.order, cfg.cp}), hosts,
                       cfg.allow_tp_across_hosts);

  validate(cfg.adamw);
  LrScheduleConfig& lc = r.lr;
  lc.max_lr = cfg.lr;
  lc.min_lr = cfg.min_lr;
  lc.warmup_iters = cfg.warmup_iters;
  lc.decay_iters = cfg.decay_iters.value_or(cfg.train_iters);
  lc.decay = cfg.lr_decay;
  const LrSchedule check_lr(lc);
  e.decay_iters = lc.decay_iters;
  return r;
}

ResolvedTrainConfig resolve_train_config(const TrainConfig& cfg, int world_size, std::vector<std::string> rank_classes,
                                         const std::vector<std::string>& hosts) {
  if (cfg.tp_choices.empty() && cfg.pp_choices.empty())
    return resolve_layout(cfg, world_size, std::move(rank_classes), hosts);
  check_ranges(cfg);
  // Every (tp, pp) in order of preference, tp's list outermost; the first that resolves wins. The
  // explicit configuration keeps the lists (so that it resolves the same way at another world
  // size) and records the chosen pair in tp and pp.
  const std::vector<int> tps = cfg.tp_choices.empty() ? std::vector<int>{cfg.tp} : cfg.tp_choices;
  const std::vector<int> pps = cfg.pp_choices.empty() ? std::vector<int>{cfg.pp} : cfg.pp_choices;
  std::vector<std::string> refused;
  for (const int tp : tps) {
    for (const int pp : pps) {
      TrainConfig c = cfg;
      c.tp = tp, c.pp = pp;
      c.tp_choices.clear(), c.pp_choices.clear();
      try {
        ResolvedTrainConfig r = resolve_layout(c, world_size, rank_classes, hosts);
        r.explicit_cfg.tp_choices = cfg.tp_choices;
        r.explicit_cfg.pp_choices = cfg.pp_choices;
        return r;
      } catch (const ConfigError& e) {
        refused.push_back(fmt::format("tp {} x pp {}: {}", tp, pp, e.what()));
      }
    }
  }
  TRIAX_THROW(ConfigError, "no layout of --tp {} and --pp {} fits a world of {} ranks (each pair in order of "
              "preference): {}", fmt::join(tps, ","), fmt::join(pps, ","), world_size, fmt::join(refused, "; "));
}

}  // namespace triax
