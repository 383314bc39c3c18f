// chat_template::Template: parse once, render many times.
#include "tessera/data/chat_template.h"

#include <fmt/format.h>

#include "renderer.h"
#include "tessera/util/error.h"

namespace tessera::data::chat_template {

Template::Template(std::string_view source, std::string name)
    : name_(std::move(name)), program_(std::make_unique<detail::Program>()) {
  program_->body = detail::parse(detail::lex(std::string(source), name_), name_);
}

Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const nlohmann::ordered_json& context) const {
  detail::Renderer r(name_, context);
  std::string out;
  detail::Flow f = detail::Flow::kNormal;
  try {
    f = r.run(program_->body, out);
  } catch (const nlohmann::json::exception& e) {
    // A value of a type an operation does not take, where no check above named it first.
    throw Error(detail::kComponent, fmt::format("{}: {}", name_, e.what()));
  }
  if (f != detail::Flow::kNormal) throw Error(detail::kComponent, name_ + ": break or continue outside a loop");
  return out;
}

}  // namespace tessera::data::chat_template
