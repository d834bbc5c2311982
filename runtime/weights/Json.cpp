//===- Json.cpp - a small strict JSON reader for weight headers ----------===//

#include "runtime/weights/Json.h"

#include <algorithm>
#include <charconv>

#include "runtime/weights/Text.h"

namespace moec::runtime::weights {
namespace {

// Headers nest three levels; the bound only stops hostile input from exhausting the stack.
constexpr int kMaxDepth = 64;

/// Length of the UTF-8 sequence starting at `text[at]`, or 0 when it is malformed.
size_t utf8SequenceLength(std::string_view text, size_t at) {
  auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  unsigned char lead = byte(at);
  if (lead < 0x80)
    return 1;
  size_t length;
  uint32_t codePoint;
  if ((lead & 0xe0) == 0xc0) {
    length = 2;
    codePoint = lead & 0x1f;
  } else if ((lead & 0xf0) == 0xe0) {
    length = 3;
    codePoint = lead & 0x0f;
  } else if ((lead & 0xf8) == 0xf0) {
    length = 4;
    codePoint = lead & 0x07;
  } else {
    return 0;
  }
  if (at + length > text.size())
    return 0;
  for (size_t i = 1; i < length; ++i) {
    if ((byte(at + i) & 0xc0) != 0x80)
      return 0;
    codePoint = (codePoint << 6) | (byte(at + i) & 0x3f);
  }
  static constexpr uint32_t kSmallest[] = {0, 0, 0x80, 0x800, 0x10000};
  if (codePoint < kSmallest[length] || codePoint > 0x10ffff ||
      (codePoint >= 0xd800 && codePoint <= 0xdfff))
    return 0;
  return length;
}

void appendUtf8(std::string &out, uint32_t codePoint) {
  if (codePoint < 0x80) {
    out += char(codePoint);
  } else if (codePoint < 0x800) {
    out += char(0xc0 | (codePoint >> 6));
    out += char(0x80 | (codePoint & 0x3f));
  } else if (codePoint < 0x10000) {
    out += char(0xe0 | (codePoint >> 12));
    out += char(0x80 | ((codePoint >> 6) & 0x3f));
    out += char(0x80 | (codePoint & 0x3f));
  } else {
    out += char(0xf0 | (codePoint >> 18));
    out += char(0x80 | ((codePoint >> 12) & 0x3f));
    out += char(0x80 | ((codePoint >> 6) & 0x3f));
    out += char(0x80 | (codePoint & 0x3f));
  }
}

class Parser {
public:
  explicit Parser(std::string_view text) : text(text) {}

  absl::StatusOr<JsonValue> parseDocument() {
    JsonValue value;
    skipWhitespace();
    if (!parseValue(value, 0))
      return error;
    skipWhitespace();
    if (pos != text.size()) {
      fail("unexpected text after the JSON value");
      return error;
    }
    return value;
  }

private:
  bool fail(std::string_view what) {
    error = absl::InvalidArgumentError(concat("at byte ", pos, ": ", what));
    return false;
  }

  bool atEnd() const { return pos >= text.size(); }
  char peek() const { return text[pos]; }

  void skipWhitespace() {
    while (!atEnd() && (peek() == ' ' || peek() == '\t' || peek() == '\n' || peek() == '\r'))
      ++pos;
  }

  bool expectWord(std::string_view word) {
    if (text.substr(pos, word.size()) != word)
      return fail("invalid literal");
    pos += word.size();
    return true;
  }

  bool parseValue(JsonValue &out, int depth) {
    if (atEnd())
      return fail("unexpected end of input, expected a value");
    switch (peek()) {
    case '{':
      return parseObject(out, depth + 1);
    case '[':
      return parseArray(out, depth + 1);
    case '"':
      out.kind = JsonValue::Kind::String;
      return parseString(out.string);
    case 't':
      out.kind = JsonValue::Kind::Bool;
      out.boolean = true;
      return expectWord("true");
    case 'f':
      out.kind = JsonValue::Kind::Bool;
      out.boolean = false;
      return expectWord("false");
    case 'n':
      out.kind = JsonValue::Kind::Null;
      return expectWord("null");
    default:
      if (peek() == '-' || (peek() >= '0' && peek() <= '9'))
        return parseNumber(out);
      return fail(concat("unexpected character '", std::string_view(&text[pos], 1), "'"));
    }
  }

  bool parseObject(JsonValue &out, int depth) {
    if (depth > kMaxDepth)
      return fail("nesting deeper than 64 levels");
    out.kind = JsonValue::Kind::Object;
    ++pos;
    skipWhitespace();
    if (!atEnd() && peek() == '}') {
      ++pos;
      return true;
    }
    // Where each key starts, so that a duplicate can be reported at its own byte.
    std::vector<size_t> keyStarts;
    while (true) {
      skipWhitespace();
      if (atEnd() || peek() != '"')
        return fail("expected a string key");
      keyStarts.push_back(pos);
      std::string key;
      if (!parseString(key))
        return false;
      skipWhitespace();
      if (atEnd() || peek() != ':')
        return fail("expected ':' after an object key");
      ++pos;
      skipWhitespace();
      JsonValue member;
      if (!parseValue(member, depth))
        return false;
      out.object.emplace_back(std::move(key), std::move(member));
      skipWhitespace();
      if (atEnd())
        return fail("unexpected end of input inside an object");
      if (peek() == '}') {
        ++pos;
        return checkDuplicateKeys(out, keyStarts);
      }
      if (peek() != ',')
        return fail("expected ',' or '}' in an object");
      ++pos;
    }
  }

  // Sorting indices keeps this O(n log n) for headers with many tensors.
  bool checkDuplicateKeys(const JsonValue &object, const std::vector<size_t> &keyStarts) {
    std::vector<size_t> order(object.object.size());
    for (size_t i = 0; i < order.size(); ++i)
      order[i] = i;
    auto keyOf = [&](size_t i) -> const std::string & { return object.object[i].first; };
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return keyOf(a) < keyOf(b); });
    for (size_t i = 1; i < order.size(); ++i) {
      if (keyOf(order[i - 1]) == keyOf(order[i])) {
        pos = keyStarts[order[i]];
        return fail(concat("duplicate key \"", keyOf(order[i]), "\""));
      }
    }
    return true;
  }

  bool parseArray(JsonValue &out, int depth) {
    if (depth > kMaxDepth)
      return fail("nesting deeper than 64 levels");
    out.kind = JsonValue::Kind::Array;
    ++pos;
    skipWhitespace();
    if (!atEnd() && peek() == ']') {
      ++pos;
      return true;
    }
    while (true) {
      skipWhitespace();
      JsonValue element;
      if (!parseValue(element, depth))
        return false;
      out.array.push_back(std::move(element));
      skipWhitespace();
      if (atEnd())
        return fail("unexpected end of input inside an array");
      if (peek() == ']') {
        ++pos;
        return true;
      }
      if (peek() != ',')
        return fail("expected ',' or ']' in an array");
      ++pos;
    }
  }

  bool parseHex4(uint32_t &value) {
    if (pos + 4 > text.size())
      return fail("truncated \\u escape");
    value = 0;
    for (int i = 0; i < 4; ++i) {
      char c = text[pos++];
      value <<= 4;
      if (c >= '0' && c <= '9')
        value |= c - '0';
      else if (c >= 'a' && c <= 'f')
        value |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F')
        value |= c - 'A' + 10;
      else
        return fail("invalid hex digit in a \\u escape");
    }
    return true;
  }

  bool parseEscape(std::string &out) {
    if (atEnd())
      return fail("unterminated string");
    char c = text[pos++];
    switch (c) {
    case '"':
    case '\\':
    case '/':
      out += c;
      return true;
    case 'b':
      out += '\b';
      return true;
    case 'f':
      out += '\f';
      return true;
    case 'n':
      out += '\n';
      return true;
    case 'r':
      out += '\r';
      return true;
    case 't':
      out += '\t';
      return true;
    case 'u':
      break;
    default:
      --pos;
      return fail("invalid escape sequence");
    }
    uint32_t codePoint;
    if (!parseHex4(codePoint))
      return false;
    if (codePoint >= 0xdc00 && codePoint <= 0xdfff)
      return fail("unpaired low surrogate in a \\u escape");
    if (codePoint >= 0xd800 && codePoint <= 0xdbff) {
      uint32_t low;
      if (text.substr(pos, 2) != "\\u")
        return fail("high surrogate not followed by a \\u low surrogate");
      pos += 2;
      if (!parseHex4(low))
        return false;
      if (low < 0xdc00 || low > 0xdfff)
        return fail("high surrogate not followed by a low surrogate");
      codePoint = 0x10000 + ((codePoint - 0xd800) << 10) + (low - 0xdc00);
    }
    appendUtf8(out, codePoint);
    return true;
  }

  bool parseString(std::string &out) {
    ++pos; // the opening quote
    while (true) {
      if (atEnd())
        return fail("unterminated string");
      unsigned char c = static_cast<unsigned char>(peek());
      if (c == '"') {
        ++pos;
        return true;
      }
      if (c == '\\') {
        ++pos;
        if (!parseEscape(out))
          return false;
        continue;
      }
      if (c < 0x20)
        return fail("unescaped control character in a string");
      size_t length = utf8SequenceLength(text, pos);
      if (length == 0)
        return fail("invalid UTF-8 in a string");
      out.append(text.substr(pos, length));
      pos += length;
    }
  }

  bool parseNumber(JsonValue &out) {
    size_t start = pos;
    auto digits = [&] {
      size_t first = pos;
      while (!atEnd() && peek() >= '0' && peek() <= '9')
        ++pos;
      return pos - first;
    };
    if (peek() == '-')
      ++pos;
    if (atEnd() || !(peek() >= '0' && peek() <= '9'))
      return fail("expected a digit");
    if (peek() == '0') {
      ++pos;
      if (!atEnd() && peek() >= '0' && peek() <= '9')
        return fail("leading zeros are not allowed");
    } else {
      digits();
    }
    bool integral = true;
    if (!atEnd() && peek() == '.') {
      integral = false;
      ++pos;
      if (digits() == 0)
        return fail("expected a digit after '.'");
    }
    if (!atEnd() && (peek() == 'e' || peek() == 'E')) {
      integral = false;
      ++pos;
      if (!atEnd() && (peek() == '+' || peek() == '-'))
        ++pos;
      if (digits() == 0)
        return fail("expected a digit in the exponent");
    }
    const char *first = text.data() + start;
    const char *last = text.data() + pos;
    if (integral) {
      auto [end, ec] = std::from_chars(first, last, out.integer);
      if (ec == std::errc() && end == last) {
        out.kind = JsonValue::Kind::Integer;
        return true;
      }
      // Too large for int64: keep it as a double rather than reject the document.
    }
    auto [end, ec] = std::from_chars(first, last, out.number);
    if (ec != std::errc() || end != last) {
      pos = start;
      return fail("number out of range");
    }
    out.kind = JsonValue::Kind::Number;
    return true;
  }

  std::string_view text;
  size_t pos = 0;
  absl::Status error;
};

} // namespace

const JsonValue *JsonValue::find(std::string_view key) const {
  for (const auto &member : object)
    if (member.first == key)
      return &member.second;
  return nullptr;
}

std::string_view jsonKindName(JsonValue::Kind kind) {
  switch (kind) {
  case JsonValue::Kind::Null:
    return "null";
  case JsonValue::Kind::Bool:
    return "a boolean";
  case JsonValue::Kind::Integer:
    return "an integer";
  case JsonValue::Kind::Number:
    return "a non-integer number";
  case JsonValue::Kind::String:
    return "a string";
  case JsonValue::Kind::Array:
    return "an array";
  case JsonValue::Kind::Object:
    return "an object";
  }
  return "a value";
}

absl::StatusOr<JsonValue> parseJson(std::string_view text) { return Parser(text).parseDocument(); }

bool isValidUtf8(std::string_view text) {
  for (size_t at = 0; at < text.size();) {
    size_t length = utf8SequenceLength(text, at);
    if (length == 0)
      return false;
    at += length;
  }
  return true;
}

void appendJsonString(std::string &out, std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  for (char c : text) {
    switch (c) {
    case '"':
      out += "\\\"";
      break;
    case '\\':
      out += "\\\\";
      break;
    case '\b':
      out += "\\b";
      break;
    case '\f':
      out += "\\f";
      break;
    case '\n':
      out += "\\n";
      break;
    case '\r':
      out += "\\r";
      break;
    case '\t':
      out += "\\t";
      break;
    default:
      if (static_cast<unsigned char>(c) < 0x20) {
        out += "\\u00";
        out += kHex[(c >> 4) & 0xf];
        out += kHex[c & 0xf];
      } else {
        out += c;
      }
    }
  }
  out += '"';
}

} // namespace moec::runtime::weights
