// A parsed XML document (the bodies of S3's and STS's responses), by expat: a tree of elements with their local names
// (a namespace prefix dropped), their text (entities, character references and CDATA decoded) and their children.
// Internal (src/include).
//
// The bodies come from servers and are untrusted: a malformed document is refused (parse_xml throws, try_parse_xml
// gives nullopt), no external entity or DTD is ever fetched, expat's guard against entity expansion ("billion laughs")
// stays on, and nesting deeper than kMaxXmlDepth is refused.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::util {

inline constexpr int kMaxXmlDepth = 64;

struct XmlElement {
  std::string name;  // the local name: "Contents" for <Contents> and <s3:Contents>
  std::string text;  // the character data directly inside it (children's excluded)
  std::vector<XmlElement> children;

  // The first child named `child`; nullptr when there is none.
  const XmlElement* child(std::string_view child) const;
  // Every child named `child`, in order.
  std::vector<const XmlElement*> children_named(std::string_view child) const;
  // The first child's text, "" when there is no such child.
  std::string child_text(std::string_view child) const;
  // The first element named `descendant` in document order (this element included); nullptr when there is none.
  const XmlElement* find(std::string_view descendant) const;
};

// `text` with &, <, >, " and ' escaped, for an element's text or an attribute.
std::string xml_escape(std::string_view text);

// Leading whitespace is skipped (S3 may send spaces before the document to keep a connection open). Throws
// tessera::Error(component, "<what>: malformed XML (line L: expat's reason)").
XmlElement parse_xml(std::string_view xml, const std::string& component, const std::string& what);
std::optional<XmlElement> try_parse_xml(std::string_view xml);

}  // namespace tessera::util
