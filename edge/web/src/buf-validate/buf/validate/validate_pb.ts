// The descriptor of buf/validate/validate.proto, reduced to its name.
//
// The generated files import buf/validate only because their fields carry
// protovalidate options. The browser never reads those options (the edge
// validates every request), so the 70 KB descriptor of validate.proto would
// only weigh down the page. An empty file of the same name satisfies the
// imports of the embedded descriptors; the options stay in them as unknown
// fields. See RATIONALE.md.

import { create } from "@bufbuild/protobuf";
import type { GenFile } from "@bufbuild/protobuf/codegenv2";
import { createFileRegistry } from "@bufbuild/protobuf";
import { FileDescriptorProtoSchema } from "@bufbuild/protobuf/wkt";

const name = "buf/validate/validate.proto";

export const file_buf_validate_validate: GenFile = createFileRegistry(
  create(FileDescriptorProtoSchema, { name, package: "buf.validate", syntax: "proto2" }),
  () => undefined,
).getFile(name)!;
