// MDS column encodings (streaming/base/format/mds/encodings.py), byte for byte.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>
#include <sstream>

#include "tessera/data/mds.h"
#include "tessera/util/error.h"
#include "tessera/util/python_json.h"

namespace tessera::data::mds {
namespace {

constexpr const char* kEncodingsComponent = "mds";

struct Scalar {
  const char* name;
  at::ScalarType dtype;
  int code;  // ndarray dtype code (_int2value_dtype)
};
constexpr Scalar kScalars[] = {{"uint8", at::kByte, 8},   {"int8", at::kChar, 9},      {"uint16", at::kUInt16, 16},
                               {"int16", at::kShort, 17}, {"float16", at::kHalf, 18},  {"uint32", at::kUInt32, 32},
                               {"int32", at::kInt, 33},   {"float32", at::kFloat, 34}, {"uint64", at::kUInt64, 64},
                               {"int64", at::kLong, 65},  {"float64", at::kDouble, 66}};

const Scalar* scalar_by_name(std::string_view name) {
  for (const Scalar& s : kScalars) {
    if (name == s.name) return &s;
  }
  return nullptr;
}
const Scalar* scalar_by_dtype(at::ScalarType t) {
  for (const Scalar& s : kScalars) {
    if (t == s.dtype) return &s;
  }
  return nullptr;
}
const Scalar* scalar_by_code(int code) {
  for (const Scalar& s : kScalars) {
    if (code == s.code) return &s;
  }
  return nullptr;
}

struct NDArraySpec {
  const Scalar* dtype = nullptr;  // nullptr: dynamic
  std::vector<int64_t> shape;     // empty: dynamic
};

NDArraySpec parse_ndarray(const std::string& encoding) {
  NDArraySpec spec;
  if (encoding == "ndarray" || encoding == "ndarray:") return spec;
  const std::string rest = encoding.substr(8);
  const size_t colon = rest.find(':');
  const std::string dtype = rest.substr(0, colon);
  spec.dtype = scalar_by_name(dtype);
  if (spec.dtype == nullptr)
    throw Error(kEncodingsComponent, fmt::format("encoding {}: unsupported dtype \"{}\"", encoding, dtype));
  if (colon != std::string::npos) {
    std::stringstream dims(rest.substr(colon + 1));
    std::string d;
    while (std::getline(dims, d, ',')) {
      try {
        spec.shape.push_back(std::stoll(d));
      } catch (const std::exception&) {
        throw Error(kEncodingsComponent, fmt::format("encoding {}: bad shape", encoding));
      }
      if (spec.shape.back() < 1)
        throw Error(kEncodingsComponent, fmt::format("encoding {}: dimensions must be >= 1", encoding));
    }
  }
  return spec;
}

template <class T>
std::string raw_bytes(T v) {
  std::string s(sizeof(T), '\0');
  std::memcpy(s.data(), &v, sizeof(T));
  return s;
}

template <class T>
T read_raw(std::string_view b) {
  T v;
  std::memcpy(&v, b.data(), sizeof(T));
  return v;
}

int64_t as_int(const std::string& enc, const Field& f) {
  if (const auto* i = std::get_if<int64_t>(&f)) return *i;
  throw Error(kEncodingsComponent, fmt::format("encoding {} needs an integer value", enc));
}
double as_double(const std::string& enc, const Field& f) {
  if (const auto* d = std::get_if<double>(&f)) return *d;
  if (const auto* i = std::get_if<int64_t>(&f)) return static_cast<double>(*i);
  throw Error(kEncodingsComponent, fmt::format("encoding {} needs a number", enc));
}

std::string encode_scalar(const Scalar& s, const std::string& enc, const Field& f) {
  switch (s.dtype) {
    case at::kByte:
      return raw_bytes(static_cast<uint8_t>(as_int(enc, f)));
    case at::kChar:
      return raw_bytes(static_cast<int8_t>(as_int(enc, f)));
    case at::kUInt16:
      return raw_bytes(static_cast<uint16_t>(as_int(enc, f)));
    case at::kShort:
      return raw_bytes(static_cast<int16_t>(as_int(enc, f)));
    case at::kUInt32:
      return raw_bytes(static_cast<uint32_t>(as_int(enc, f)));
    case at::kInt:
      return raw_bytes(static_cast<int32_t>(as_int(enc, f)));
    case at::kUInt64:
      return raw_bytes(static_cast<uint64_t>(as_int(enc, f)));
    case at::kLong:
      return raw_bytes(as_int(enc, f));
    case at::kHalf:
      return raw_bytes(c10::Half(static_cast<float>(as_double(enc, f))).x);
    case at::kFloat:
      return raw_bytes(static_cast<float>(as_double(enc, f)));
    case at::kDouble:
      return raw_bytes(as_double(enc, f));
    default:
      break;
  }
  throw Error(kEncodingsComponent, "unreachable scalar type");
}

Field decode_scalar(const Scalar& s, std::string_view b) {
  switch (s.dtype) {
    case at::kByte:
      return int64_t{read_raw<uint8_t>(b)};
    case at::kChar:
      return int64_t{read_raw<int8_t>(b)};
    case at::kUInt16:
      return int64_t{read_raw<uint16_t>(b)};
    case at::kShort:
      return int64_t{read_raw<int16_t>(b)};
    case at::kUInt32:
      return int64_t{read_raw<uint32_t>(b)};
    case at::kInt:
      return int64_t{read_raw<int32_t>(b)};
    case at::kUInt64:
      return static_cast<int64_t>(read_raw<uint64_t>(b));
    case at::kLong:
      return read_raw<int64_t>(b);
    case at::kHalf: {
      c10::Half h;
      h.x = read_raw<uint16_t>(b);
      return static_cast<double>(static_cast<float>(h));
    }
    case at::kFloat:
      return static_cast<double>(read_raw<float>(b));
    case at::kDouble:
      return read_raw<double>(b);
    default:
      break;
  }
  throw Error(kEncodingsComponent, "unreachable scalar type");
}

std::string encode_ndarray(const std::string& enc, const Field& f) {
  const auto* tp = std::get_if<at::Tensor>(&f);
  if (tp == nullptr) throw Error(kEncodingsComponent, fmt::format("encoding {} needs a tensor", enc));
  const NDArraySpec spec = parse_ndarray(enc);
  const at::Tensor t = tp->contiguous().cpu();
  const Scalar* dtype = scalar_by_dtype(t.scalar_type());
  if (dtype == nullptr)
    throw Error(kEncodingsComponent,
                fmt::format("encoding {}: unsupported dtype {}", enc, c10::toString(t.scalar_type())));
  if (t.dim() == 0) throw Error(kEncodingsComponent, fmt::format("encoding {}: attempting to encode a scalar", enc));
  if (t.numel() == 0)
    throw Error(kEncodingsComponent, fmt::format("encoding {}: attempting to encode an array with 0 elements", enc));
  if (spec.dtype != nullptr && spec.dtype != dtype) {
    throw Error(kEncodingsComponent, fmt::format("encoding {}: got dtype {}", enc, dtype->name));
  }
  if (!spec.shape.empty() && spec.shape != t.sizes().vec()) {
    throw Error(kEncodingsComponent, fmt::format("encoding {}: got shape [{}]", enc, fmt::join(t.sizes().vec(), ",")));
  }
  std::string out;
  if (spec.dtype == nullptr) out += static_cast<char>(dtype->code);
  if (spec.shape.empty()) {
    if (t.dim() > 63) throw Error(kEncodingsComponent, fmt::format("encoding {}: more than 63 dimensions", enc));
    const int64_t biggest = *std::max_element(t.sizes().begin(), t.sizes().end());
    const int code = biggest < (1 << 8) ? 0 : biggest < (1 << 16) ? 1 : biggest < (int64_t{1} << 32) ? 2 : 3;
    out += static_cast<char>((t.dim() << 2) | code);
    for (int64_t d : t.sizes()) {
      if (code == 0) out += raw_bytes(static_cast<uint8_t>(d));
      if (code == 1) out += raw_bytes(static_cast<uint16_t>(d));
      if (code == 2) out += raw_bytes(static_cast<uint32_t>(d));
      if (code == 3) out += raw_bytes(static_cast<uint64_t>(d));
    }
  }
  out.append(static_cast<const char*>(t.data_ptr()), static_cast<size_t>(t.numel() * t.element_size()));
  return out;
}

Field decode_ndarray(const std::string& enc, std::string_view b) {
  const NDArraySpec spec = parse_ndarray(enc);
  size_t pos = 0;
  auto need = [&](size_t n) {
    if (pos + n > b.size()) throw Error(kEncodingsComponent, fmt::format("encoding {}: value truncated", enc));
  };
  const Scalar* dtype = spec.dtype;
  if (dtype == nullptr) {
    need(1);
    dtype = scalar_by_code(static_cast<unsigned char>(b[pos++]));
    if (dtype == nullptr) throw Error(kEncodingsComponent, fmt::format("encoding {}: unknown dtype code", enc));
  }
  std::vector<int64_t> shape = spec.shape;
  if (shape.empty()) {
    need(1);
    const auto head = static_cast<unsigned char>(b[pos++]);
    const int code = head & 3, ndim = head >> 2;
    const size_t width = size_t{1} << code;
    need(width * static_cast<size_t>(ndim));
    for (int i = 0; i < ndim; ++i, pos += width) {
      uint64_t d = 0;
      std::memcpy(&d, b.data() + pos, width);  // little-endian
      shape.push_back(static_cast<int64_t>(d));
    }
  }
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  const size_t nbytes = static_cast<size_t>(numel) * c10::elementSize(dtype->dtype);
  if (b.size() - pos != nbytes) {
    throw Error(kEncodingsComponent, fmt::format("encoding {}: {} value bytes for shape [{}] of {}", enc,
                                                 b.size() - pos, fmt::join(shape, ","), dtype->name));
  }
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(dtype->dtype));
  std::memcpy(t.data_ptr(), b.data() + pos, nbytes);
  return t;
}

}  // namespace

std::optional<int64_t> encoded_size(const std::string& enc) {
  if (enc == "bytes" || enc == "str" || enc == "str_int" || enc == "str_float" || enc == "str_decimal" ||
      enc == "json") {
    return std::nullopt;
  }
  if (enc == "int") return 8;
  if (const Scalar* s = scalar_by_name(enc)) return static_cast<int64_t>(c10::elementSize(s->dtype));
  if (enc == "ndarray" || enc.starts_with("ndarray:")) {
    const NDArraySpec spec = parse_ndarray(enc);
    if (spec.dtype == nullptr || spec.shape.empty()) return std::nullopt;
    int64_t n = static_cast<int64_t>(c10::elementSize(spec.dtype->dtype));
    for (int64_t d : spec.shape) n *= d;
    return n;
  }
  if (enc == "pkl") throw Error(kEncodingsComponent, "encoding pkl is refused: unpickling could run code");
  throw Error(kEncodingsComponent, fmt::format("unsupported encoding \"{}\"", enc));
}

std::string encode(const std::string& enc, const Field& value) {
  if (const auto* s = std::get_if<std::string>(&value)) return *s;  // bytes pass through, as in Python
  if (enc == "int") return raw_bytes(as_int(enc, value));
  if (const Scalar* s = scalar_by_name(enc)) return encode_scalar(*s, enc, value);
  if (enc == "str_int") return std::to_string(as_int(enc, value));
  if (enc == "str_float") return util::python_float_repr(as_double(enc, value));
  if (enc == "json") {
    if (const auto* j = std::get_if<nlohmann::ordered_json>(&value)) return util::python_json_dumps(*j);
    throw Error(kEncodingsComponent, "encoding json needs a JSON value");
  }
  if (enc == "ndarray" || enc.starts_with("ndarray:")) return encode_ndarray(enc, value);
  encoded_size(enc);  // throws for unknown encodings
  throw Error(kEncodingsComponent, fmt::format("encoding {} needs a string", enc));
}

Field decode(const std::string& enc, std::string_view b) {
  if (enc == "bytes" || enc == "str" || enc == "str_decimal") return std::string(b);
  if (enc == "int") {
    if (b.size() != 8) throw Error(kEncodingsComponent, "encoding int: expected 8 bytes");
    return read_raw<int64_t>(b);
  }
  if (const Scalar* s = scalar_by_name(enc)) {
    if (b.size() != c10::elementSize(s->dtype))
      throw Error(kEncodingsComponent, fmt::format("encoding {}: wrong size", enc));
    return decode_scalar(*s, b);
  }
  try {
    if (enc == "str_int") return static_cast<int64_t>(std::stoll(std::string(b)));
    if (enc == "str_float") return std::stod(std::string(b));
    if (enc == "json") return nlohmann::ordered_json::parse(b);
  } catch (const std::exception& e) {
    throw Error(kEncodingsComponent,
                fmt::format("encoding {}: cannot decode \"{}\"", enc, std::string(b.substr(0, 40))));
  }
  if (enc == "ndarray" || enc.starts_with("ndarray:")) return decode_ndarray(enc, b);
  encoded_size(enc);
  throw Error(kEncodingsComponent, fmt::format("unsupported encoding \"{}\"", enc));
}

}  // namespace tessera::data::mds
