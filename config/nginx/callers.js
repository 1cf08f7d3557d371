// nginx's js module (njs): the caller of a request, from its API key (`Authorization: Bearer <key>`).
// Written beside the site by onnxpool with the SHA-256 digests of the configured keys, never a key;
// fields look like %{table}. An unknown or missing key is no caller (""): the workers answer 401.
var crypto = require("crypto");
var CALLERS = %{table};

function caller(r) {
    var found = /^\s*bearer\s+(\S+)\s*$/i.exec(r.headersIn.Authorization || "");
    if (found === null) {
        return "";
    }
    var name = CALLERS[crypto.createHash("sha256").update(found[1]).digest("hex")];
    return name === undefined ? "" : name;
}

export default {caller};
