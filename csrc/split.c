#include "pcr_native.h"

/* Markers without a length field: SOI, EOI, RSTn, TEM. */
static int standalone(uint8_t m) { return m == 0xD8 || m == 0xD9 || (m >= 0xD0 && m <= 0xD7) || m == 0x01; }

int pcr_split_scans(const uint8_t *buf, size_t len, uint64_t *ends, size_t max_ends,
                    size_t *n_ends) {
    if (!buf || !ends || !n_ends) return PCR_E_ARG;
    *n_ends = 0;
    if (len < 4 || buf[0] != 0xFF || buf[1] != 0xD8) return PCR_E_NOT_JPEG;
    size_t pos = 2, n = 0;
    for (;;) {
        /* Expect a marker; 0xFF fill bytes may precede the code. */
        if (pos >= len) return PCR_E_TRUNCATED;
        if (buf[pos] != 0xFF) return PCR_E_BAD_MARKER;
        while (pos < len && buf[pos] == 0xFF) pos++;
        if (pos >= len) return PCR_E_TRUNCATED;
        uint8_t m = buf[pos++];
        if (m == 0x00) return PCR_E_BAD_MARKER;
        if (m == 0xD9) break; /* EOI: not stored, trailing bytes ignored */
        if (m == 0xD8) return PCR_E_BAD_MARKER;
        if (standalone(m)) continue;
        if (len - pos < 2) return PCR_E_TRUNCATED;
        size_t seglen = ((size_t)buf[pos] << 8) | buf[pos + 1];
        if (seglen < 2) return PCR_E_BAD_MARKER;
        if (len - pos < seglen) return PCR_E_TRUNCATED;
        pos += seglen;
        if (m != 0xDA) continue;
        /* Entropy-coded data: ends at the first FF xx with xx neither 00 nor RSTn. */
        for (;;) {
            if (pos >= len) return PCR_E_TRUNCATED;
            if (buf[pos] != 0xFF) { pos++; continue; }
            if (pos + 1 >= len) return PCR_E_TRUNCATED;
            uint8_t x = buf[pos + 1];
            if (x == 0x00 || (x >= 0xD0 && x <= 0xD7)) { pos += 2; continue; }
            break;
        }
        if (n >= max_ends) return PCR_E_TOO_MANY;
        ends[n++] = pos;
    }
    if (n == 0) return PCR_E_NO_SCAN;
    *n_ends = n;
    return PCR_OK;
}
