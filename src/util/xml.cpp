// XML documents through expat (xml.h).
#include "tessera/util/xml.h"

#include <expat.h>
#include <fmt/format.h>

#include <cstring>
#include <limits>
#include <memory>

#include "tessera/util/error.h"

namespace tessera::util {
namespace {

struct Builder {
  XML_Parser parser = nullptr;
  XmlElement root;                // a holder: the document element is its only child
  std::vector<XmlElement*> open;  // the path from the holder to the element being read
  std::string error;              // set by a handler that stops the parse
};

void on_start(void* data, const XML_Char* name, const XML_Char** /*attributes*/) {
  auto* b = static_cast<Builder*>(data);
  if (static_cast<int>(b->open.size()) > kMaxXmlDepth) {
    b->error = fmt::format("nested deeper than {} elements", kMaxXmlDepth);
    XML_StopParser(b->parser, XML_FALSE);
    return;
  }
  const char* local = std::strrchr(name, ':');
  XmlElement e;
  e.name = local == nullptr ? name : local + 1;
  b->open.back()->children.push_back(std::move(e));
  b->open.push_back(&b->open.back()->children.back());
}

void on_end(void* data, const XML_Char* /*name*/) {
  static_cast<Builder*>(data)->open.pop_back();
}

void on_text(void* data, const XML_Char* s, int len) {
  auto* b = static_cast<Builder*>(data);
  if (b->open.size() > 1) b->open.back()->text.append(s, static_cast<size_t>(len));
}

// A DTD's entity declarations are refused outright: S3 and STS never send one, and expansion is where XML's
// amplification attacks live.
void on_entity(void* data, const XML_Char* /*name*/, int /*is_parameter*/, const XML_Char* /*value*/, int /*length*/,
               const XML_Char* /*base*/, const XML_Char* /*system_id*/, const XML_Char* /*public_id*/,
               const XML_Char* /*notation*/) {
  auto* b = static_cast<Builder*>(data);
  b->error = "declares an entity";
  XML_StopParser(b->parser, XML_FALSE);
}

// nullopt on success, else why the document is refused.
std::optional<std::string> parse(std::string_view xml, XmlElement& out) {
  const size_t start = xml.find_first_not_of(" \t\r\n");
  xml.remove_prefix(start == std::string_view::npos ? xml.size() : start);
  if (xml.size() > static_cast<size_t>(std::numeric_limits<int>::max())) return "larger than 2 GiB";
  const std::unique_ptr<XML_ParserStruct, decltype(&XML_ParserFree)> parser(XML_ParserCreate("UTF-8"), &XML_ParserFree);
  if (!parser) return "expat could not allocate a parser";
  Builder b;
  b.parser = parser.get();
  b.open.push_back(&b.root);
  XML_SetUserData(parser.get(), &b);
  XML_SetElementHandler(parser.get(), on_start, on_end);
  XML_SetCharacterDataHandler(parser.get(), on_text);
  XML_SetEntityDeclHandler(parser.get(), on_entity);
  XML_SetParamEntityParsing(parser.get(), XML_PARAM_ENTITY_PARSING_NEVER);
  const XML_Status status = XML_Parse(parser.get(), xml.data(), static_cast<int>(xml.size()), XML_TRUE);
  if (!b.error.empty()) return b.error;
  if (status != XML_STATUS_OK) {
    return fmt::format("line {}: {}", XML_GetCurrentLineNumber(parser.get()),
                       XML_ErrorString(XML_GetErrorCode(parser.get())));
  }
  if (b.root.children.size() != 1) return "no document element";
  out = std::move(b.root.children.front());
  return std::nullopt;
}

}  // namespace

const XmlElement* XmlElement::child(std::string_view child) const {
  for (const XmlElement& c : children) {
    if (c.name == child) return &c;
  }
  return nullptr;
}

std::vector<const XmlElement*> XmlElement::children_named(std::string_view child) const {
  std::vector<const XmlElement*> out;
  for (const XmlElement& c : children) {
    if (c.name == child) out.push_back(&c);
  }
  return out;
}

std::string XmlElement::child_text(std::string_view child) const {
  const XmlElement* c = this->child(child);
  return c == nullptr ? std::string() : c->text;
}

const XmlElement* XmlElement::find(std::string_view descendant) const {
  if (name == descendant) return this;
  for (const XmlElement& c : children) {
    if (const XmlElement* found = c.find(descendant)) return found;
  }
  return nullptr;
}

std::string xml_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

XmlElement parse_xml(std::string_view xml, const std::string& component, const std::string& what) {
  XmlElement out;
  if (auto problem = parse(xml, out)) throw Error(component, fmt::format("{}: malformed XML ({})", what, *problem));
  return out;
}

std::optional<XmlElement> try_parse_xml(std::string_view xml) {
  XmlElement out;
  if (parse(xml, out)) return std::nullopt;
  return out;
}

}  // namespace tessera::util
