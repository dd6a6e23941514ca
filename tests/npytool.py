"""Tiny .npy reader for the tests (float32 C-order 2-D only; no numpy needed).
usage: npytool.py shape FILE            -> prints "rows cols"
       npytool.py same A B [from_row_of_A]  -> exit 0 iff B == A[from:] bit for bit
       npytool.py close A B FROM TOL        -> exit 0 iff max |B - A[from:]| <= TOL and argmax per row equal
       npytool.py argmax FILE [from_row] -> prints the argmax of each row, comma-separated
       npytool.py finite FILE            -> exit 0 iff every value is finite"""
import ast, math, struct, sys

def load(path):
    with open(path, "rb") as f:
        data = f.read()
    assert data[:6] == b"\x93NUMPY", "not an npy file"
    hlen = struct.unpack("<H", data[8:10])[0]
    hdr = ast.literal_eval(data[10:10 + hlen].decode())
    assert hdr["descr"] == "<f4" and not hdr["fortran_order"], hdr
    rows, cols = hdr["shape"]
    body = data[10 + hlen:]
    assert len(body) == rows * cols * 4, (len(body), rows, cols)
    return rows, cols, body

def main():
    cmd = sys.argv[1]
    if cmd == "shape":
        r, c, _ = load(sys.argv[2]); print(r, c); return 0
    if cmd == "same":
        ra, ca, a = load(sys.argv[2]); rb, cb, b = load(sys.argv[3])
        start = int(sys.argv[4]) if len(sys.argv) > 4 else 0
        want = a[start * ca * 4:]
        if ca != cb or rb != ra - start or b != want:
            print(f"mismatch: A {ra}x{ca} from row {start}, B {rb}x{cb}")
            if ca == cb and rb == ra - start:
                fa = struct.unpack(f"<{len(want)//4}f", want); fb = struct.unpack(f"<{len(b)//4}f", b)
                print("max |diff|", max(abs(x - y) for x, y in zip(fa, fb)))
            return 1
        return 0
    if cmd == "close": # close A B START TOL: B == A's rows from START within TOL, the same argmax per row
        ra, ca, a = load(sys.argv[2]); rb, cb, b = load(sys.argv[3])
        start, tol = int(sys.argv[4]), float(sys.argv[5])
        if ca != cb or rb != ra - start:
            print(f"mismatch: A {ra}x{ca} from row {start}, B {rb}x{cb}"); return 1
        fa = struct.unpack(f"<{rb*ca}f", a[start * ca * 4:]); fb = struct.unpack(f"<{rb*cb}f", b)
        diff = max(abs(x - y) for x, y in zip(fa, fb))
        am = lambda f, i: max(range(ca), key=lambda j: (f[i*ca+j], -j))
        same_argmax = all(am(fa, i) == am(fb, i) for i in range(rb))
        print(f"max |diff| {diff}, argmax {'equal' if same_argmax else 'differs'}")
        return 0 if diff <= tol and same_argmax else 1
    if cmd == "argmax":
        r, c, body = load(sys.argv[2]); start = int(sys.argv[3]) if len(sys.argv) > 3 else 0
        vals = struct.unpack(f"<{r*c}f", body)
        out = [max(range(c), key=lambda j: (vals[i*c+j], -j)) for i in range(start, r)]
        print(",".join(map(str, out))); return 0
    if cmd == "finite":
        r, c, body = load(sys.argv[2])
        return 0 if all(math.isfinite(v) for v in struct.unpack(f"<{r*c}f", body)) else 1
    return 2

sys.exit(main())
