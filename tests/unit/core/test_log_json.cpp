// JSON log records: every record parses, carries the six keys, escapes what needs escaping,
// embeds structured fields, survives invalid UTF-8, and prints time as RFC 3339 UTC.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "triax/core/log_json.h"

using namespace triax;
using nlohmann::json;

TEST_CASE("json log record has time, rank, host, level, message, fields", "[log]") {
  const std::string line = log::json_record(log::Level::warn, "slow rank", R"({"rank_ms": 12.5, "peer": 3})", 7,
                                            "node-01", 1764583200.25);
  CHECK(line.find('\n') == std::string::npos);
  const json j = json::parse(line);
  CHECK(j.at("time") == "2025-12-01T10:00:00.250Z");
  CHECK(j.at("rank") == 7);
  CHECK(j.at("host") == "node-01");
  CHECK(j.at("level") == "warn");
  CHECK(j.at("message") == "slow rank");
  CHECK(j.at("fields").at("rank_ms") == 12.5);
  CHECK(j.at("fields").at("peer") == 3);
}

TEST_CASE("json log record escapes quotes, newlines and control characters", "[log]") {
  const std::string msg = "a \"quoted\"\nsecond line\twith tab \\ and \x01";
  const std::string line = log::json_record(log::Level::error, msg, "", 0, "h", 0.999);
  CHECK(line.find('\n') == std::string::npos);
  const json j = json::parse(line);
  CHECK(j.at("message") == msg);
  CHECK(j.at("fields").is_object());
  CHECK(j.at("fields").empty());
  CHECK(j.at("time") == "1970-01-01T00:00:00.999Z");
  CHECK(j.at("level") == "error");
}

TEST_CASE("json log record keeps bad fields as raw text and replaces invalid UTF-8", "[log]") {
  const json a = json::parse(log::json_record(log::Level::info, "m", "not json", 1, "h", 10));
  CHECK(a.at("fields").at("raw") == "not json");
  const json b = json::parse(log::json_record(log::Level::info, "m", "[1, 2]", 1, "h", 10));
  CHECK(b.at("fields").at("raw") == "[1, 2]");
  const std::string bad = std::string("bytes \xff\xfe end");
  const json c = json::parse(log::json_record(log::Level::debug, bad, "", 1, "h", 10));
  CHECK(c.at("message").get<std::string>().find("end") != std::string::npos);
  CHECK(c.at("level") == "debug");
}
