// zstd and gzip codecs for MDS shards.
#include "compression.h"

#include <fmt/format.h>
#include <zlib.h>
#include <zstd.h>

#include <limits>
#include <memory>

#include "tessera/util/error.h"

namespace tessera::data::mds::detail {
namespace {

struct Spec {
  std::string family;
  int level;
};

Spec parse(const std::string& spec) {
  const size_t colon = spec.find(':');
  Spec s{spec.substr(0, colon), 0};
  int lo = 0, hi = 0, def = 0;
  if (s.family == "zstd") {
    lo = 1, hi = 22, def = 3;
  } else if (s.family == "gz") {
    lo = 0, hi = 9, def = 9;
  } else {
    throw Error("mds", fmt::format("compression \"{}\" is not supported (zstd[:level], gz[:level])", spec));
  }
  s.level = def;
  if (colon != std::string::npos) {
    try {
      s.level = std::stoi(spec.substr(colon + 1));
    } catch (const std::exception&) {
      s.level = -1;
    }
    if (s.level < lo || s.level > hi) {
      throw Error("mds", fmt::format("compression \"{}\": level must lie in [{}, {}]", spec, lo, hi));
    }
  }
  return s;
}

}  // namespace

std::string compression_extension(const std::string& spec) {
  return parse(spec).family;
}

std::string compress(const std::string& spec, std::string_view raw) {
  const Spec s = parse(spec);
  if (s.family == "zstd") {
    // As Streaming's `zstd` module compresses (zstd 1.5.7, ZSTD_compress2 with worker threads, whose framing is the
    // same for any number of workers and differs from single-threaded compression above one job's size).
    std::unique_ptr<ZSTD_CCtx, size_t (*)(ZSTD_CCtx*)> cctx(ZSTD_createCCtx(), ZSTD_freeCCtx);
    if (!cctx) throw Error("mds", "zstd: out of memory");
    for (const auto& [param, value] : {std::pair{ZSTD_c_compressionLevel, s.level}, std::pair{ZSTD_c_nbWorkers, 1}}) {
      const size_t r = ZSTD_CCtx_setParameter(cctx.get(), param, value);
      if (ZSTD_isError(r)) throw Error("mds", fmt::format("zstd: {}", ZSTD_getErrorName(r)));
    }
    std::string out(ZSTD_compressBound(raw.size()), '\0');
    const size_t n = ZSTD_compress2(cctx.get(), out.data(), out.size(), raw.data(), raw.size());
    if (ZSTD_isError(n)) throw Error("mds", fmt::format("zstd compression failed: {}", ZSTD_getErrorName(n)));
    out.resize(n);
    return out;
  }
  z_stream z{};
  if (deflateInit2(&z, s.level, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
    throw Error("mds", "gzip initialisation failed");
  }
  std::string out(deflateBound(&z, raw.size()) + 32, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(raw.data()));
  z.avail_in = static_cast<uInt>(raw.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  const int rc = deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  if (rc != Z_STREAM_END) throw Error("mds", "gzip compression failed");
  return out;
}

std::string decompress(const std::string& spec, std::string_view data, uint64_t expected_bytes,
                       const std::string& what) {
  const Spec s = parse(spec);
  const auto too_long = [&] {
    return Error("mds", fmt::format("{}: decompresses to more than the {} bytes index.json gives for the shard "
                                    "(raw_data.bytes): corrupt or crafted",
                                    what, expected_bytes));
  };
  const auto too_short = [&](uint64_t got) {
    return Error("mds", fmt::format("{}: decompresses to {} bytes, index.json says {} (raw_data.bytes)", what, got,
                                    expected_bytes));
  };
  if (expected_bytes > kMaxRawShardBytes) {
    throw Error("mds", fmt::format("{}: index.json gives the shard {} bytes, more than an MDS shard can hold ({})",
                                   what, expected_bytes, kMaxRawShardBytes));
  }
  std::string out;
  if (s.family == "zstd") {
    const unsigned long long size = ZSTD_getFrameContentSize(data.data(), data.size());
    if (size == ZSTD_CONTENTSIZE_ERROR) throw Error("mds", fmt::format("{}: not a zstd frame", what));
    if (size != ZSTD_CONTENTSIZE_UNKNOWN) {
      // The frame's own size is a claim: checked against the index before it becomes an allocation.
      if (size > expected_bytes) throw too_long();
      if (size < expected_bytes) throw too_short(size);
      out.resize(size);
      const size_t n = ZSTD_decompress(out.data(), out.size(), data.data(), data.size());
      if (ZSTD_isError(n) || n != size) {
        throw Error("mds", fmt::format("{}: zstd data is corrupt ({})", what,
                                       ZSTD_isError(n) ? ZSTD_getErrorName(n) : "short"));
      }
      return out;
    }
    std::unique_ptr<ZSTD_DStream, size_t (*)(ZSTD_DStream*)> ds(ZSTD_createDStream(), ZSTD_freeDStream);
    if (!ds) throw Error("mds", "zstd: out of memory");
    ZSTD_inBuffer in{data.data(), data.size(), 0};
    std::string buf(ZSTD_DStreamOutSize(), '\0');
    size_t rc = 1;
    while (in.pos < in.size && rc != 0) {
      ZSTD_outBuffer o{buf.data(), buf.size(), 0};
      rc = ZSTD_decompressStream(ds.get(), &o, &in);
      if (ZSTD_isError(rc))
        throw Error("mds", fmt::format("{}: zstd data is corrupt ({})", what, ZSTD_getErrorName(rc)));
      if (out.size() + o.pos > expected_bytes) throw too_long();
      out.append(buf.data(), o.pos);
    }
    if (rc != 0) throw Error("mds", fmt::format("{}: zstd data is truncated", what));
  } else {
    z_stream z{};
    if (inflateInit2(&z, 15 + 32) != Z_OK) throw Error("mds", "gzip initialisation failed");
    std::unique_ptr<z_stream, int (*)(z_stream*)> guard(&z, inflateEnd);
    if (data.size() > std::numeric_limits<uInt>::max()) throw Error("mds", fmt::format("{}: too large for gzip", what));
    z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
    z.avail_in = static_cast<uInt>(data.size());
    char buf[1 << 16];
    int rc = Z_OK;
    while (rc == Z_OK) {
      z.next_out = reinterpret_cast<Bytef*>(buf);
      z.avail_out = sizeof(buf);
      rc = inflate(&z, Z_NO_FLUSH);
      const size_t n = sizeof(buf) - z.avail_out;
      if (out.size() + n > expected_bytes) throw too_long();
      out.append(buf, n);
      if (rc == Z_BUF_ERROR && z.avail_in == 0) break;
    }
    if (rc != Z_STREAM_END) throw Error("mds", fmt::format("{}: gzip data is corrupt or truncated", what));
  }
  if (out.size() != expected_bytes) throw too_short(out.size());
  return out;
}

}  // namespace tessera::data::mds::detail
