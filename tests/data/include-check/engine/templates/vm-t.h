#include "vm-c.h"
