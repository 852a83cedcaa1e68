// Name <-> value tables of the enums that people spell (flags, TOML files, logs, plans): one table
// per enum, EnumNames<E>, and the lookups every user shares (print, parse, list the choices).
// The pipeline schedule and the recomputation mode live here with their tables because both the
// planner (plan/, which may include only core/) and the runtime (pipeline/, model/) spell them.
#pragma once
#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "triax/core/error.h"

namespace triax {

template <class E>
struct EnumName {
  std::string_view name;
  E value;
};

// Specialise next to the enum: `what` names it in messages ("pipeline schedule"), `table` lists
// every value once with its one spelling, in the order --help shows them.
template <class E>
struct EnumNames;

// The spelling of v ("?" for a value outside the table).
template <class E>
constexpr std::string_view enum_name(E v) {
  for (const auto& e : EnumNames<E>::table)
    if (e.value == v) return e.name;
  return "?";
}

template <class E>
constexpr std::optional<E> find_enum(std::string_view name) {
  for (const auto& e : EnumNames<E>::table)
    if (e.name == name) return e.value;
  return std::nullopt;
}

template <class E>
std::vector<std::string> enum_names() {
  std::vector<std::string> out;
  for (const auto& e : EnumNames<E>::table) out.emplace_back(e.name);
  return out;
}

// "gpipe, 1f1b, interleaved, zb-h1"
template <class E>
std::string enum_choices() {
  std::string s;
  for (const auto& e : EnumNames<E>::table) s += (s.empty() ? "" : ", ") + std::string(e.name);
  return s;
}

// The value spelled `name`; ConfigError "unknown pipeline schedule 'x'; expected one of: ..." otherwise.
template <class E>
E parse_enum(std::string_view name) {
  if (const auto v = find_enum<E>(name)) return *v;
  TRIAX_THROW(ConfigError, "unknown {} '{}'; expected one of: {}", EnumNames<E>::what, name, enum_choices<E>());
}

// Pipeline schedules (pipeline/schedule.h generates them, plan/ prices them; docs/SCHEDULES.md).
enum class ScheduleKind { gpipe, one_f_one_b, interleaved, zb_h1 };
template <>
struct EnumNames<ScheduleKind> {
  static constexpr std::string_view what = "pipeline schedule";
  static constexpr std::array<EnumName<ScheduleKind>, 4> table{{{"gpipe", ScheduleKind::gpipe},
                                                                {"1f1b", ScheduleKind::one_f_one_b},
                                                                {"interleaved", ScheduleKind::interleaved},
                                                                {"zb-h1", ScheduleKind::zb_h1}}};
};

// Activation recomputation (model/gpt.h says what each mode keeps; plan/ prices them).
enum class Recompute { none, selective, full };
template <>
struct EnumNames<Recompute> {
  static constexpr std::string_view what = "recompute mode";
  static constexpr std::array<EnumName<Recompute>, 3> table{
      {{"none", Recompute::none}, {"selective", Recompute::selective}, {"full", Recompute::full}}};
};

}  // namespace triax
