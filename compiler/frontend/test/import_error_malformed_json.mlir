//===- import_error_malformed_json.mlir - config.json that is not JSON ----===//

// Tests that a trailing comma is reported with the file, line and column.
// RUN: not moec import %inputs/malformed_trailing_comma.json 2>&1 | FileCheck %s --match-full-lines --check-prefix=COMMA
// COMMA: moec: error: {{.*}}/Inputs/malformed_trailing_comma.json: malformed JSON: [5:1, byte=74]: Expected object key

// Tests that a file cut short is reported where it ends.
// RUN: not moec import %inputs/malformed_truncated.json 2>&1 | FileCheck %s --match-full-lines --check-prefix=TRUNCATED
// TRUNCATED: moec: error: {{.*}}/Inputs/malformed_truncated.json: malformed JSON: [4:0, byte=51]: Expected , or } after object property

// Tests that valid JSON whose top level is not an object is rejected by kind.
// RUN: not moec import %inputs/malformed_top_level_list.json 2>&1 | FileCheck %s --match-full-lines --check-prefix=LIST
// LIST: moec: error: {{.*}}/Inputs/malformed_top_level_list.json: expected a JSON object at the top level, got a list

// Tests that a config that does not exist is an error naming it.
// RUN: not moec import %inputs/no_such_config.json 2>&1 | FileCheck %s --match-full-lines --check-prefix=ABSENT
// ABSENT: moec: error: {{.*}}/Inputs/no_such_config.json: cannot read: No such file or directory
