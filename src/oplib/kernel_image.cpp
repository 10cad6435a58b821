// What a prebuilt kernel file says of itself (see kernel_image.h, which describes the formats).
#include "kernel_image.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <map>

#include "opforge/error.h"

namespace opforge::detail::image {
namespace {

constexpr uint32_t kFatbinMagic = 0xBA55ED50u;
constexpr uint16_t kElfMachineCuda = 190;  // EM_CUDA
constexpr uint8_t kKparamInfo = 0x17;      // EIATTR_KPARAM_INFO
constexpr uint8_t kCbankParamSize = 0x19;  // EIATTR_CBANK_PARAM_SIZE

/// Little-endian reads that report running past the end instead of reading it.
struct Reader {
  const std::string& bytes;
  bool ok = true;
  template <class T>
  T at(uint64_t offset) {
    T v{};
    if (offset > bytes.size() || bytes.size() - offset < sizeof(T)) {
      ok = false;
      return v;
    }
    std::memcpy(&v, bytes.data() + offset, sizeof(T));
    return v;
  }
};

/// `text` without `//` and `/* */` comments.
std::string without_comments(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text.compare(i, 2, "//") == 0) {
      i = text.find('\n', i);
      if (i == std::string::npos) break;
      out += '\n';
    } else if (text.compare(i, 2, "/*") == 0) {
      i = text.find("*/", i + 2);
      if (i == std::string::npos) break;
      ++i;
      out += ' ';
    } else {
      out += text[i];
    }
  }
  return out;
}

/// The size in bytes of a PTX fundamental type (".u64", ".f32", ".b8", ".pred"), 0 if none.
uint32_t ptx_type_size(const std::string& type) {
  if (type == ".pred") return 1;
  if (type.size() < 3 || std::string("usbf").find(type[1]) == std::string::npos) return 0;
  const std::string bits = type.substr(2);
  if (bits == "8") return 1;
  if (bits == "16") return 2;
  if (bits == "32") return 4;
  if (bits == "64") return 8;
  if (bits == "128") return 16;
  return 0;
}

/// One `.param` declaration's size ("  .param .align 8 .b8 p[16]"), or nullopt if unreadable.
std::optional<uint32_t> ptx_param_size(const std::string& decl) {
  std::vector<std::string> words;
  std::string cur;
  for (char c : decl + " ") {
    if (std::isspace(static_cast<unsigned char>(c))) {
      if (!cur.empty()) words.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (words.empty() || words[0] != ".param") return std::nullopt;
  uint32_t element = 0;
  for (size_t w = 1; w < words.size(); ++w) {
    if (words[w] == ".align" || words[w] == ".ptr") {
      if (words[w] == ".align") ++w;  // its value
      continue;
    }
    if (words[w][0] == '.') {
      if (const uint32_t s = ptx_type_size(words[w])) element = s;  // other qualifiers: state spaces
      continue;
    }
    // The name, with an optional [count].
    const size_t open = words[w].find('[');
    if (open == std::string::npos) return element ? std::optional<uint32_t>(element) : std::nullopt;
    const uint64_t count = std::strtoull(words[w].c_str() + open + 1, nullptr, 10);
    return element && count ? std::optional<uint32_t>(static_cast<uint32_t>(element * count)) : std::nullopt;
  }
  return std::nullopt;
}

/// The architecture of a `.target` directive's first target ("sm_90a" -> 90, arch-specific).
void read_ptx_target(const std::string& text, Code& code) {
  const size_t at = text.find(".target");
  if (at == std::string::npos) return;
  size_t i = text.find("sm_", at);
  if (i == std::string::npos || text.find('\n', at) < i) return;
  i += 3;
  int arch = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) arch = arch * 10 + (text[i++] - '0');
  code.arch = arch;
  code.arch_specific = i < text.size() && text[i] == 'a';
}

Code read_ptx(const std::string& bytes) {
  const std::string text = without_comments(bytes.substr(0, bytes.find('\0')));
  Code code;
  code.ptx = true;
  read_ptx_target(text, code);
  for (size_t at = text.find(".entry"); at != std::string::npos; at = text.find(".entry", at + 6)) {
    size_t i = at + 6;
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
    size_t end = i;
    while (end < text.size() && !std::isspace(static_cast<unsigned char>(text[end])) && text[end] != '(' &&
           text[end] != '{')
      ++end;
    Kernel k;
    k.name = text.substr(i, end - i);
    while (end < text.size() && std::isspace(static_cast<unsigned char>(text[end]))) ++end;
    std::vector<uint32_t> sizes;
    bool known = true;
    if (end < text.size() && text[end] == '(') {
      const size_t close = text.find(')', end);
      if (close == std::string::npos)
        throw InternalError("a damaged PTX file: the parameters of " + k.name + " end nowhere");
      std::string list = text.substr(end + 1, close - end - 1);
      size_t from = 0;
      while (from <= list.size() && list.find_first_not_of(" \t\r\n", from) != std::string::npos) {
        size_t comma = list.find(',', from);
        if (comma == std::string::npos) comma = list.size();
        const std::optional<uint32_t> s = ptx_param_size(list.substr(from, comma - from));
        if (s) sizes.push_back(*s);
        else known = false;
        from = comma + 1;
      }
    }
    if (known) k.sizes = std::move(sizes);
    code.kernels.push_back(std::move(k));
  }
  return code;
}

/// The parameters a cubin's `.nv.info.<kernel>` section records, or nullopt where it records
/// none that can be read (an attribute of an unknown format, ordinals with gaps, a total size
/// without the parameters that make it up).
std::optional<std::vector<uint32_t>> read_nv_info(const std::string& bytes, uint64_t offset, uint64_t size) {
  Reader r{bytes};
  std::map<uint16_t, uint32_t> by_ordinal;
  uint32_t total = 0;
  for (uint64_t p = offset; p < offset + size;) {
    const uint8_t format = r.at<uint8_t>(p), attribute = r.at<uint8_t>(p + 1);
    const uint16_t value = r.at<uint16_t>(p + 2);
    if (!r.ok || format < 1 || format > 4) return std::nullopt;
    if (format == 4 && attribute == kKparamInfo && value == 12) {
      const uint16_t ordinal = r.at<uint16_t>(p + 8);
      by_ordinal[ordinal] = r.at<uint32_t>(p + 12) >> 18;
    } else if (format == 3 && attribute == kCbankParamSize) {
      total = value;
    }
    p += 4 + (format == 4 ? value : 0);
  }
  std::vector<uint32_t> sizes;
  for (const auto& [ordinal, s] : by_ordinal) {
    if (ordinal != sizes.size()) return std::nullopt;
    sizes.push_back(s);
  }
  if (sizes.empty() && total > 0) return std::nullopt;
  return sizes;
}

Code read_cubin(const std::string& bytes) {
  Reader r{bytes};
  if (r.at<uint8_t>(4) != 2 || r.at<uint8_t>(5) != 1)
    throw InternalError("an ELF object that is not a cubin (not 64-bit little-endian)");
  if (r.at<uint16_t>(18) != kElfMachineCuda)
    throw InternalError("an ELF object that is not a cubin (its machine is " + std::to_string(r.at<uint16_t>(18)) +
                        ", not EM_CUDA)");
  const uint8_t abi_version = r.at<uint8_t>(8);
  const uint32_t flags = r.at<uint32_t>(0x30);
  const uint64_t shoff = r.at<uint64_t>(0x28);
  const uint16_t shentsize = r.at<uint16_t>(0x3A), shnum = r.at<uint16_t>(0x3C), shstrndx = r.at<uint16_t>(0x3E);
  Code code;
  code.arch = static_cast<int>(abi_version >= 8 ? (flags >> 8) & 0xff : flags & 0xff);
  auto section = [&](uint16_t i, uint32_t field_offset) { return shoff + uint64_t{i} * shentsize + field_offset; };
  if (!r.ok || shentsize < 64 || shstrndx >= shnum) throw InternalError("a damaged cubin (its section table)");
  const uint64_t names = r.at<uint64_t>(section(shstrndx, 24)), names_size = r.at<uint64_t>(section(shstrndx, 32));
  if (!r.ok || names > bytes.size() || names_size > bytes.size() - names)
    throw InternalError("a damaged cubin (its section names)");
  const std::string prefix = ".nv.info.";
  for (uint16_t i = 0; i < shnum; ++i) {
    const uint32_t name = r.at<uint32_t>(section(i, 0));
    if (!r.ok || name >= names_size) throw InternalError("a damaged cubin (section " + std::to_string(i) + "'s name)");
    const char* text = bytes.data() + names + name;
    const std::string section_name(text, strnlen(text, names_size - name));
    if (section_name.compare(0, prefix.size(), prefix) != 0) continue;  // others may take no file space (NOBITS)
    const uint64_t offset = r.at<uint64_t>(section(i, 24)), size = r.at<uint64_t>(section(i, 32));
    if (!r.ok || offset > bytes.size() || size > bytes.size() - offset)
      throw InternalError("a damaged cubin (section " + std::to_string(i) + " lies past its end)");
    code.kernels.push_back({section_name.substr(prefix.size()), read_nv_info(bytes, offset, size)});
  }
  return code;
}

std::vector<Code> read_fatbin(const std::string& bytes) {
  Reader r{bytes};
  const uint16_t header = r.at<uint16_t>(6);
  const uint64_t size = r.at<uint64_t>(8);
  if (!r.ok || header < 16 || header > bytes.size() || size > bytes.size() - header)
    throw InternalError("a damaged fatbin (its header gives " + std::to_string(size) +
                        " bytes of entries in a file of " + std::to_string(bytes.size()) + ")");
  std::vector<Code> codes;
  for (uint64_t p = header; p < header + size;) {
    const uint16_t kind = r.at<uint16_t>(p);
    const uint32_t entry_header = r.at<uint32_t>(p + 4);
    const uint64_t payload = r.at<uint64_t>(p + 8);
    const uint32_t arch = r.at<uint32_t>(p + 28);
    const uint64_t flags = r.at<uint64_t>(p + 40), uncompressed = r.at<uint64_t>(p + 56);
    if (!r.ok || entry_header < 64 || p + entry_header > bytes.size() || payload > bytes.size() - p - entry_header)
      throw InternalError("a damaged fatbin (an entry at byte " + std::to_string(p) + " lies past its end)");
    const bool compressed = (flags & 0xA000u) != 0 || uncompressed != 0;
    if (kind == 1 || kind == 2) {
      Code code;
      const std::string data = compressed ? std::string() : bytes.substr(p + entry_header, payload);
      if (!compressed) code = kind == 1 ? read_ptx(data) : read_cubin(data);
      code.ptx = kind == 1;
      code.arch = static_cast<int>(arch);  // the entry's own (a PTX file's .target may be older)
      code.readable = !compressed;
      codes.push_back(std::move(code));
    }
    p += entry_header + payload;
  }
  return codes;
}

}  // namespace

Kind kind_of(const std::string& bytes) {
  if (bytes.size() >= 4 && std::memcmp(bytes.data(),
                                       "\x7f"
                                       "ELF",
                                       4) == 0)
    return Kind::kCubin;
  uint32_t magic = 0;
  if (bytes.size() >= 4) std::memcpy(&magic, bytes.data(), 4);
  if (magic == kFatbinMagic) return Kind::kFatbin;
  const std::string head = without_comments(bytes.substr(0, std::min<size_t>(bytes.size(), 4096)));
  const size_t first = head.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && (head.compare(first, 8, ".version") == 0 || head.compare(first, 7, ".target") == 0))
    return Kind::kPtx;
  return Kind::kNone;
}

std::string Code::describe() const {
  const std::string target = "sm_" + std::to_string(arch) + (arch_specific ? "a" : "");
  return ptx ? "PTX for " + target : target + " code";
}

const Kernel* Code::find(const std::string& name) const {
  for (const Kernel& k : kernels)
    if (k.name == name) return &k;
  return nullptr;
}

bool Code::runs_on(int cc) const {
  if (ptx) return arch_specific ? cc == arch : cc >= arch;
  return cc / 10 == arch / 10 && cc % 10 >= arch % 10;
}

std::vector<Code> read(const std::string& bytes) {
  switch (kind_of(bytes)) {
    case Kind::kCubin:
      return {read_cubin(bytes)};
    case Kind::kFatbin:
      return read_fatbin(bytes);
    case Kind::kPtx:
      return {read_ptx(bytes)};
    case Kind::kNone:
      break;
  }
  throw InternalError(
      "not a cubin, fatbin or PTX file (it starts with neither an ELF header, the fatbin magic nor a "
      "PTX .version directive)");
}

const Code* code_for(const std::vector<Code>& codes, int cc) {
  const Code* best = nullptr;
  for (const Code& c : codes) {
    if (!c.runs_on(cc)) continue;
    // Machine code before PTX, then the newest.
    if (best == nullptr || (best->ptx && !c.ptx) || (best->ptx == c.ptx && c.arch > best->arch)) best = &c;
  }
  return best;
}

std::string describe(const std::vector<Code>& codes) {
  std::string text;
  for (const Code& c : codes) text += (text.empty() ? "" : ", ") + c.describe();
  return text.empty() ? "no code" : text;
}

}  // namespace opforge::detail::image
